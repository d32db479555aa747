"""The gradient's norm, per tensor and in all, clipped on the device; and, when it is not finite,
which parameters made it so.

Without a gradient scaler (fp32, bf16) a non-finite gradient with a finite loss is applied by
the optimizer and turns the weights into NaN; the step records (`taser.training.records`) then
stop the run before the next checkpoint is written. The norms stay on the device: reading them
every step would make the host wait for the GPU.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch.nn.utils import clip_grads_with_norm_, get_total_norm

_BLOCK = re.compile(r"^(.*?\.layer\.\d+)\.")


@dataclass
class GradNorms:
    total: torch.Tensor  # 0-dim, on the device
    per_tensor: torch.Tensor  # 1-D, one norm per entry of `names`
    names: list[str]  # the parameters that had a gradient this step


def clip_gradients(named_params: Iterable[tuple[str, torch.nn.Parameter]], max_norm: float) -> GradNorms | None:
    """Clip the gradients to `max_norm` in all (`inf`: measure only) and return their norms, or
    None when no parameter has a gradient. Nothing is read back to the host."""
    named = [(n, p) for n, p in named_params if p.grad is not None]
    if not named:
        return None
    grads = [p.grad for _, p in named]
    per_tensor = torch.stack([n.float() for n in torch._foreach_norm(grads)])
    total = get_total_norm([per_tensor])  # the 2-norm of the tensors' 2-norms: the norm of them all
    if math.isfinite(max_norm):
        clip_grads_with_norm_([p for _, p in named], max_norm, total)
    return GradNorms(total, per_tensor, [n for n, _ in named])


def parameter_group(name: str) -> str:
    """The part of the model a parameter belongs to, as a user reads it: its Transformer block
    (`question_encoder.encoder.layer.3`), else its first two name parts (`passage_encoder.embeddings`)."""
    block = _BLOCK.match(name)
    if block:
        return block.group(1)
    return ".".join(name.split(".")[:2])


def describe_non_finite(norms: GradNorms) -> str:
    """Which parameter groups hold a non-finite gradient (this reads the per-tensor norms: only on
    the error path), e.g. 'question_encoder.encoder.layer.1 (4 tensors, first ...attention.self.query.weight)'."""
    values = norms.per_tensor.tolist()
    groups: dict[str, list[str]] = {}
    for name, value in zip(norms.names, values):
        if not math.isfinite(value):
            groups.setdefault(parameter_group(name), []).append(name)
    if not groups:
        return "no single tensor (their sum overflowed)"
    parts = [f"{group} ({len(names)} tensor{'s' if len(names) > 1 else ''}, first {names[0]})" for group, names in groups.items()]
    return "; ".join(parts)
