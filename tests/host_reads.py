"""What makes the host wait for a GPU, seen by a torch function mode: reading a device tensor's
values, or an op whose output size depends on them (boolean-mask indexing, `nonzero`, `bincount`,
`repeat_interleave` with tensor repeats, ...).

Learned routing reads the host once per routed layer per step by design (each expert's share of
the units); those reads are allowed only inside the functions of `ROUTED`, so that a new read
anywhere else still trips the guard.
"""

from __future__ import annotations

import sys

import torch
from torch.overrides import TorchFunctionMode

T = torch.Tensor
# ops that always read the device's values back
ALWAYS = {T.item, T.tolist, T.__float__, T.__int__, T.__bool__, T.__index__, T.cpu, T.numpy, T.nonzero, torch.nonzero, T.masked_select,
          torch.masked_select, torch.unique, T.unique, torch.unique_consecutive, T.unique_consecutive, torch.bincount, T.bincount,
          torch.argwhere, T.argwhere, torch.histc, T.histc}
# ops that read back only with some arguments
INDEXING = {T.__getitem__, T.__setitem__, T.index_put_, T.index_put, torch.index_put}
REPEATS = {torch.repeat_interleave, T.repeat_interleave}

# the routed layers' reads, (module file, function): each expert's count of units (dispatch), the rows holding an
# expert's tokens (an attention expert's run_tokens), the real tokens' routing records on padded inputs (record)
# and the load-balance loss's bincount
ROUTED = {("taser/models/moe.py", "dispatch"), ("taser/models/moe.py", "run_tokens"), ("taser/models/routers.py", "record"),
          ("taser/models/routers.py", "load_balance_loss")}


def _bool_index(index) -> bool:
    if isinstance(index, (tuple, list)):
        return any(_bool_index(i) for i in index)
    return isinstance(index, torch.Tensor) and index.dtype == torch.bool


def is_host_read(func, args, kwargs) -> bool:
    if func in ALWAYS:
        return True
    if func in INDEXING:
        index = args[1] if len(args) > 1 else kwargs.get("indices")
        return _bool_index(index)
    if func in REPEATS:
        repeats = args[1] if len(args) > 1 else kwargs.get("repeats")
        if len(args) == 1 and isinstance(args[0], torch.Tensor) and func is torch.repeat_interleave and repeats is None:
            return True  # repeat_interleave(repeats): the output's size is the sum of the values
        return isinstance(repeats, torch.Tensor) and repeats.numel() > 1 and kwargs.get("output_size") is None
    if func is torch.where and len(args) == 1:
        return True  # where(condition) is nonzero
    return False


def _routed_caller() -> tuple[str, str] | None:
    frame = sys._getframe(2)
    while frame is not None:
        where = (frame.f_code.co_filename.replace("\\", "/"), frame.f_code.co_name)
        for path, function in ROUTED:
            if where[0].endswith(path) and where[1] == function:
                return path, function
        frame = frame.f_back
    return None


class NoHostReads(TorchFunctionMode):
    """Fails on any read of a tensor's values back to the host (on a GPU each one is a sync), except
    inside the routed layers' functions (`ROUTED`) when `allow_routed`; those are counted."""

    def __init__(self, allow_routed: bool = False):
        super().__init__()
        self.allow_routed = allow_routed
        self.routed_reads: list[tuple[str, str]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if is_host_read(func, args, kwargs):
            caller = _routed_caller() if self.allow_routed else None
            if caller is None:
                raise AssertionError(f"host read inside a training step: {getattr(func, '__name__', func)}")
            self.routed_reads.append(caller)
        return func(*args, **kwargs)


class CountHostReads(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.reads = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if is_host_read(func, args, kwargs):
            self.reads.append(getattr(func, "__name__", str(func)))
        return func(*args, **kwargs)
