"""Dropout masks on CPU at a quarter of the random numbers: 15-bit thresholds, 4 per 64-bit draw.

`nn.Dropout` on CPU draws one float per element (`bernoulli_`), keeps a float mask for backward
and multiplies twice: 16.6 ms for a [4,400 x 384] activation on 2 cores, where this module's
`keep_mask` and `torch.where` took 3.6 ms (`benchmarks/peers/roofline.py` measures the step).
The mask is applied as a multiplication by its bytes (0 or 1), after the 1 / (1 - p) scale: on
CPU that is several times faster than `torch.where` or `masked_fill` with the bool mask.
A 64-bit draw of the global generator (`random_` on int64 gives 63 uniform bits) is read as four
16-bit lanes, each masked to 15 bits and compared with the threshold round(p * 2**15): the drop
probability is p rounded to a multiple of 2**-15 (0.1 -> 0.100006), the rule the attention
dropout (`taser.models.attention`) already follows. Backward keeps the mask as bools.

The masks come from the global torch generator, so `torch.manual_seed` and the gradient cache's
random-state replay reproduce them. Off CPU, or in eval mode, `MaskDropout` is `nn.Dropout`.
"""

from __future__ import annotations

import math

import torch
from torch import nn

RESOLUTION_BITS = 15
RESOLUTION = 1 << RESOLUTION_BITS  # the drop probability is rounded to a multiple of 2**-15


def drop_threshold(p: float) -> int:
    return round(p * RESOLUTION)


def _lanes(shape: torch.Size | tuple[int, ...], device: torch.device | str) -> torch.Tensor:
    """Independent uniform integers in [0, 2**15) of `shape`, four to a 64-bit draw."""
    if torch.compiler.is_compiling():  # a dtype view breaks the graph: one draw per number there
        return torch.randint(0, RESOLUTION, tuple(shape), dtype=torch.int16, device=device)
    count = math.prod(shape)
    words = torch.empty((count + 3) // 4, dtype=torch.int64, device=device).random_()  # 63 uniform bits each
    return words.view(torch.int16)[:count].bitwise_and_(RESOLUTION - 1).view(shape)


def keep_mask(shape: torch.Size | tuple[int, ...], p: float, device: torch.device | str = "cpu") -> torch.Tensor:
    """Booleans of `shape`, each True (kept) with probability 1 - round(p * 2**15) / 2**15, independently."""
    return _lanes(shape, device) >= drop_threshold(p)


def drop_mask(shape: torch.Size | tuple[int, ...], p: float, device: torch.device | str = "cpu") -> torch.Tensor:
    """Booleans of `shape`, each True (dropped) with probability round(p * 2**15) / 2**15, independently."""
    return _lanes(shape, device) < drop_threshold(p)


class _MaskedDropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, p: float):
        keep = keep_mask(x.shape, p, x.device)
        scale = 1.0 / (1.0 - p)
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return torch.mul(x, scale).mul_(keep.view(torch.uint8))

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (keep,) = ctx.saved_tensors
        return torch.mul(grad, ctx.scale).mul_(keep.view(torch.uint8)), None


class MaskDropout(nn.Dropout):
    """`nn.Dropout` with `keep_mask`'s masks in CPU training (see the module docstring)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0 or x.device.type != "cpu" or self.inplace:
            return super().forward(x)
        if not 0.0 < self.p < 1.0:
            raise ValueError(f"dropout probability must be in [0, 1), got {self.p}")
        return _MaskedDropout.apply(x, float(self.p))


def use_mask_dropout(module: nn.Module, enabled: bool = True) -> int:
    """Make every `nn.Dropout` in `module` a `MaskDropout` (or back, `enabled=False`), keeping its
    rate; returns how many were switched."""
    switched = 0
    for sub in module.modules():
        if type(sub) is (nn.Dropout if enabled else MaskDropout):
            sub.__class__ = MaskDropout if enabled else nn.Dropout
            switched += 1
    return switched
