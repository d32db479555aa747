"""DPR's contrastive loss: softmax NLL of each question's positive among its candidate passages.

Passages arrive as one list (each question's positive followed by its own negatives); the
candidates of a question are either every passage of the batch (in-batch negatives: a
B x (B + B*h) score matrix) or only its own group (`in_batch=False`, "1-of-N" in DPR's Table 3).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from taser.models.config import Similarity


@dataclass
class LossConfig:
    similarity: str = "dot"
    temperature: float = 1.0  # divides the scores; DPR's dot product uses 1
    in_batch: bool = True

    def __post_init__(self):
        self.similarity = Similarity.parse(self.similarity, "similarity").value
        if self.temperature <= 0:
            raise ValueError("temperature must be > 0")


def similarity_scores(q: torch.Tensor, ctx: torch.Tensor, similarity: str) -> torch.Tensor:
    if similarity == "dot":
        return q @ ctx.T
    if similarity == "cosine":
        return F.normalize(q, dim=-1) @ F.normalize(ctx, dim=-1).T
    if similarity == "l2":  # negative squared Euclidean distance
        return -(q.pow(2).sum(-1, keepdim=True) - 2 * q @ ctx.T + ctx.pow(2).sum(-1)[None, :])
    raise ValueError(f"unknown similarity {similarity!r}")


def contrastive_nll(
    q: torch.Tensor,
    ctx: torch.Tensor,
    positive_idx: torch.Tensor,
    ctx_owner: torch.Tensor,
    config: LossConfig,
    question_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-question NLL and whether the positive scored highest.

    q: [B, d] questions; ctx: [N, d] passages; positive_idx: [B] row of each question's positive
    in ctx; ctx_owner: [N] the question id each passage was sampled for; question_ids: [B] ids
    of these questions (default 0..B-1; differs under distributed gathering).
    """
    scores = similarity_scores(q.float(), ctx.float(), config.similarity) / config.temperature
    if not config.in_batch:
        ids = question_ids if question_ids is not None else torch.arange(len(q), device=q.device)
        scores = scores.masked_fill(ctx_owner[None, :] != ids[:, None], float("-inf"))
    nll = F.cross_entropy(scores, positive_idx, reduction="none")
    correct = scores.argmax(-1) == positive_idx
    return nll, correct
