"""The retrieval losses by name (taser.training.loss computes them); torch-free, so that reading the settings
(taser.training.config) needs no torch and the loss module can import it without a cycle."""

from __future__ import annotations

from taser.choice import Choice


class LossKind(Choice):
    nll = "nll"  # softmax negative log-likelihood of the positive (DPR's)
    triplet = "triplet"  # hinge on s(q, p+) - s(q, p-) with a margin (DPR's Table 6)
