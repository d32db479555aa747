"""The reader's AdamW parameter groups: the encoder at `learning_rate`, the span and selection heads
(`qa_outputs`, `qa_classifier`, drawn fresh from N(0, 0.02)) at `head_learning_rate`.

Why a rate of their own: Adam moves a weight by at most about lr per step, and a fresh head's
logits are small on encoders whose last hidden states are small (all-MiniLM-L6-v2's per-token
norm is about 4.6, so DPR's initialisation gives start logits of std 0.1); at an encoder's rate
(1e-5 .. 5e-5) the heads take thousands of steps to give the span softmax any shape. Biases and
norms take no weight decay, as in `taser.training.lr_decay`.
"""

from __future__ import annotations

from torch import nn

from taser.training.lr_decay import param_groups

HEADS = ("qa_outputs", "qa_classifier")


def head_parameter_ids(model: nn.Module) -> set[int]:
    return {id(p) for name in HEADS for p in getattr(model, name).parameters()}


def reader_param_groups(model: nn.Module, learning_rate: float, weight_decay: float, head_learning_rate: float | None = None) -> list[dict]:
    """`param_groups` of `model`, with the heads' parameters moved to groups at `head_learning_rate`
    (None: one rate for all, the groups `param_groups` gives). Each group carries `name`
    ("encoder" or "heads") for logs."""
    groups = param_groups(model, learning_rate, weight_decay)
    if head_learning_rate is None:
        return [{**g, "name": "encoder"} for g in groups]
    heads = head_parameter_ids(model)
    out = []
    for group in groups:
        body = [p for p in group["params"] if id(p) not in heads]
        head = [p for p in group["params"] if id(p) in heads]
        if body:
            out.append({**group, "params": body, "name": "encoder"})
        if head:
            out.append({**group, "params": head, "lr": head_learning_rate, "name": "heads"})
    return out
