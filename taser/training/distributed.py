"""Data-parallel training with `torchrun`: gather passages across ranks, sum gradients.

Each rank encodes its slice of the global batch. Its questions are scored against every rank's
passages; the gather's backward sums each passage's gradient over the ranks whose questions
used it, and parameter gradients are then summed. With each rank's loss divided by the global
number of questions, the result equals one process that sees the whole batch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def init_distributed(backend: str | None = None) -> DistInfo:
    """Join the process group that `torchrun` describes in the environment (if any)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo()
    if not dist.is_initialized():
        backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        dist.init_process_group(backend)
    info = DistInfo(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))
    if torch.cuda.is_available():
        torch.cuda.set_device(info.local_rank)
    return info


class _GatherWithGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor: torch.Tensor, sizes: list[int]):
        ctx.sizes, ctx.rank = sizes, dist.get_rank()
        width = max(sizes)
        padded = tensor.new_zeros((width, *tensor.shape[1:]))
        padded[: len(tensor)] = tensor
        parts = [torch.empty_like(padded) for _ in sizes]
        dist.all_gather(parts, padded.contiguous())
        return torch.cat([p[:n] for p, n in zip(parts, sizes)])

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.contiguous()
        dist.all_reduce(grad)  # every rank's questions contribute to every passage's gradient
        start = sum(ctx.sizes[: ctx.rank])
        return grad[start : start + ctx.sizes[ctx.rank]], None


def gather_sizes(n: int, device) -> list[int]:
    sizes = [torch.zeros(1, dtype=torch.long, device=device) for _ in range(dist.get_world_size())]
    dist.all_gather(sizes, torch.tensor([n], device=device))
    return [int(s.item()) for s in sizes]


def gather_with_grad(tensor: torch.Tensor) -> tuple[torch.Tensor, int]:
    """All ranks' rows concatenated in rank order, and where this rank's rows start."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return tensor, 0
    sizes = gather_sizes(len(tensor), tensor.device)
    return _GatherWithGrad.apply(tensor, sizes), sum(sizes[: dist.get_rank()])


def all_reduce_gradients(params) -> None:
    """Sum gradients over ranks in one flat buffer.

    A parameter no rank used keeps no gradient (as in a single process); one used on some
    ranks only (e.g. an expert that got no tokens here) counts as zero where it was unused.
    """
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    params = [p for p in params if p.requires_grad]
    used = torch.tensor([float(p.grad is not None) for p in params])
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads] + [used.to(grads[0].device, grads[0].dtype)])
    dist.all_reduce(flat)
    offset = 0
    for p, n_used in zip(params, flat[-len(params):].tolist()):
        n = p.numel()
        p.grad = flat[offset : offset + n].view_as(p) if n_used > 0 else None  # views of one buffer
        offset += n


def all_reduce_sum(value: float | torch.Tensor) -> float:
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return float(value)
    t = torch.as_tensor(value, dtype=torch.float64).clone()
    dist.all_reduce(t)
    return float(t)
