"""Turn token states into one vector: `[CLS]` (DPR) or the mean over real tokens."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from taser.models.config import Pooling


def pool(hidden: torch.Tensor, attention_mask: torch.Tensor, mode: str, normalize: bool = False) -> torch.Tensor:
    if mode == "cls":
        vec = hidden[:, 0]
    elif mode == "mean":
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        vec = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
    else:
        Pooling.parse(mode, "pooling")  # raises: the message names the allowed values
        raise AssertionError(mode)
    if normalize:
        vec = F.normalize(vec.float(), dim=-1).to(vec.dtype)
    return vec
