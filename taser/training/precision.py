"""Mixed precision by config: `bf16` autocast (CPUs that support it, GPUs), `fp16` with a
gradient scaler (GPUs without bf16), or `fp32`."""

from __future__ import annotations

import contextlib

import torch

PRECISIONS = ("fp32", "bf16", "fp16")


def autocast(precision: str, device: torch.device):
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; expected one of {PRECISIONS}")
    if precision == "fp32":
        return contextlib.nullcontext()
    if precision == "fp16" and device.type != "cuda":
        raise ValueError("fp16 needs a GPU; use precision=bf16 on CPUs")
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


def grad_scaler(precision: str, device: torch.device):
    """A GradScaler for fp16 (bf16 and fp32 need none)."""
    if precision == "fp16":
        return torch.amp.GradScaler(device.type)
    return None
