"""DPR's retrieval losses: softmax NLL of each question's positive among its candidate passages
(the default), or the triplet loss of DPR's Table 6.

Passages arrive as one list (each question's positive followed by its own negatives); the
candidates of a question are either every passage of the batch (in-batch negatives: a
B x (B + B*h) score matrix) or only its own group (`in_batch=False`, "1-of-N" in DPR's Table 3).

The triplet loss (DPR §5.3, Table 6, margin 1.0) compares the positive with each negative
candidate directly: for question q with positive p+ and its negative candidates N(q) (the same
candidates the NLL would use, in-batch and the question's own, or its own only under 1-of-N),

    L(q) = 1/|N(q)| * sum over p- in N(q) of max(0, margin - s(q, p+) + s(q, p-))

with s the model's similarity (dot, cosine, or negative squared L2 distance), unscaled: the
temperature belongs to the NLL only. A question without a negative candidate has loss 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from taser.models.config import Similarity
from taser.training.loss_kind import LossKind


@dataclass
class LossConfig:
    similarity: str = "dot"
    temperature: float = 1.0  # divides the NLL's scores; DPR's dot product uses 1
    in_batch: bool = True
    loss: str = "nll"
    margin: float = 1.0  # triplet only (DPR's)

    def __post_init__(self):
        self.similarity = Similarity.parse(self.similarity, "similarity").value
        self.loss = LossKind.parse(self.loss, "loss").value
        if self.temperature <= 0:
            raise ValueError("temperature must be > 0")
        if not self.margin > 0:
            raise ValueError(f"the triplet margin must be > 0, got {self.margin}")


def similarity_scores(q: torch.Tensor, ctx: torch.Tensor, similarity: str) -> torch.Tensor:
    if similarity == "dot":
        return q @ ctx.T
    if similarity == "cosine":
        return F.normalize(q, dim=-1) @ F.normalize(ctx, dim=-1).T
    if similarity == "l2":  # negative squared Euclidean distance
        return -(q.pow(2).sum(-1, keepdim=True) - 2 * q @ ctx.T + ctx.pow(2).sum(-1)[None, :])
    raise ValueError(f"unknown similarity {similarity!r}")


def _triplet(scores: torch.Tensor, positive_idx: torch.Tensor, candidate: torch.Tensor, margin: float) -> torch.Tensor:
    rows = torch.arange(len(scores), device=scores.device)
    positive = scores[rows, positive_idx]
    negative = candidate.clone()
    negative[rows, positive_idx] = False
    hinge = (margin - positive[:, None] + scores).clamp(min=0) * negative
    return hinge.sum(-1) / negative.sum(-1).clamp(min=1)


def retrieval_loss(
    q: torch.Tensor,
    ctx: torch.Tensor,
    positive_idx: torch.Tensor,
    ctx_owner: torch.Tensor,
    config: LossConfig,
    question_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-question loss (`config.loss`) and whether the positive scored highest.

    q: [B, d] questions; ctx: [N, d] passages; positive_idx: [B] row of each question's positive
    in ctx; ctx_owner: [N] the question id each passage was sampled for; question_ids: [B] ids
    of these questions (default 0..B-1; differs under distributed gathering).
    """
    scores = similarity_scores(q.float(), ctx.float(), config.similarity)
    if config.in_batch:
        candidate = torch.ones_like(scores, dtype=torch.bool)
    else:
        ids = question_ids if question_ids is not None else torch.arange(len(q), device=q.device)
        candidate = ctx_owner[None, :] == ids[:, None]
    correct = scores.masked_fill(~candidate, float("-inf")).argmax(-1) == positive_idx
    if config.loss == LossKind.triplet:
        return _triplet(scores, positive_idx, candidate, config.margin), correct
    logits = (scores / config.temperature).masked_fill(~candidate, float("-inf"))
    return F.cross_entropy(logits, positive_idx, reduction="none"), correct

