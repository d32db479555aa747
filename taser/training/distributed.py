"""Data-parallel training with `torchrun`: gather passages across ranks, sum gradients.

Each rank encodes its slice of the global batch. Its questions are scored against every rank's
passages; the gather's backward sums each passage's gradient over the ranks whose questions
used it, and torch's DistributedDataParallel then sums parameter gradients over the ranks,
overlapping communication with the backward pass. With each rank's loss divided by the global
number of questions, the result equals one process that sees the whole batch.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)

@dataclass
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    started_group: bool = field(default=False, compare=False)  # init_distributed started it: its caller ends it

    @property
    def is_main(self) -> bool:
        return self.rank == 0


INIT_METHOD_ENV = "TASER_DIST_INIT"
# On a GPU the default group carries both kinds of tensor: NCCL the device's, gloo the host's (row
# counts, `taser.training.distributed.gather_sizes`), so no side group is needed for host facts.
GPU_BACKEND = "cpu:gloo,cuda:nccl"
DEFAULT_TIMEOUT_S = 1800  # a collective waiting longer than this fails (NCCL's own default: 10 minutes)


def first_host(nodelist: str) -> str:
    """The first host of a SLURM node list: `gpu[03-05,09],cpu1` -> `gpu03`."""
    head = ""
    depth = 0
    for ch in nodelist:  # the first entry: up to a comma outside brackets
        if ch == "," and depth == 0:
            break
        depth += ch == "["
        depth -= ch == "]"
        head += ch
    if "[" not in head:
        return head
    prefix, rest = head.split("[", 1)
    inside, after = rest.split("]", 1)
    return prefix + inside.split(",")[0].split("-")[0] + first_host(after)  # node[1-4]-ib -> node1-ib; r[1-2]-n[01-04] -> r1-n01


PORT_BASE, PORT_SPAN = 20000, 12000  # 20000-31999: below Linux's ephemeral ports (32768-60999), where a port may be taken by any client


def master_port(job: int, step: int = 0) -> int:
    """The rendezvous port of a SLURM job step: from its ids, outside the ephemeral range."""
    return PORT_BASE + (job * 7 + step) % PORT_SPAN


def slurm_step_tasks(environ=None) -> int:
    """How many tasks this process's SLURM step runs it as (0 outside a step). A process started from
    an interactive shell (`srun -n 8 --pty bash`, or `salloc` then `srun --pty bash`) inherits the
    shell's step, task 0 of N, though it was started alone: a `--pty` step (SLURM_PTY_PORT) counts as
    one task, as PyTorch Lightning treats interactive shells. Start several tasks with `srun -n N`
    without `--pty`, or with torchrun."""
    env = os.environ if environ is None else environ
    tasks = int(env.get("SLURM_STEP_NUM_TASKS") or 0)
    if tasks > 1 and env.get("SLURM_PTY_PORT"):
        log.info("an interactive SLURM shell (srun --pty, %d tasks): this process runs alone", tasks)
        return 1
    return tasks


def slurm_environment(environ=None) -> dict[str, str]:
    """torchrun's variables from SLURM's, for a process that `srun` (or submitit) started as one
    task of several, when torchrun is not the launcher: RANK (SLURM_PROCID), WORLD_SIZE (the step's
    tasks), LOCAL_RANK (SLURM_LOCALID), MASTER_ADDR (the step's first node) and MASTER_PORT (from the
    job id unless set). {} outside such a step, or when torchrun's variables are already there."""
    env = os.environ if environ is None else environ
    tasks = slurm_step_tasks(env)  # srun's; a batch script's own process has none (it must not wait for others)
    if "WORLD_SIZE" in env or tasks <= 1 or "SLURM_PROCID" not in env:
        return {}
    nodes = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or "127.0.0.1"
    job = int(env.get("SLURM_JOB_ID", "0") or 0)
    step = int(env.get("SLURM_STEP_ID", "0") or 0) if str(env.get("SLURM_STEP_ID", "0")).isdigit() else 0
    return {"RANK": env["SLURM_PROCID"], "WORLD_SIZE": str(tasks), "LOCAL_RANK": env.get("SLURM_LOCALID", "0"),
            "LOCAL_WORLD_SIZE": env.get("SLURM_STEP_TASKS_PER_NODE", "1").split("(")[0].split(",")[0],
            "MASTER_ADDR": env.get("MASTER_ADDR") or first_host(nodes), "MASTER_PORT": env.get("MASTER_PORT") or str(master_port(job, step))}


def default_backend(device: torch.device) -> str:
    """The process group for a run on `device`: gloo on the CPU (NCCL refuses CPU tensors, even on a
    host that has GPUs), gloo for host tensors and NCCL for device tensors on a GPU."""
    return GPU_BACKEND if device.type == "cuda" else "gloo"


def init_distributed(backend: str | None = None, init_method: str | None = None, device: str | torch.device = "auto",
                     timeout_s: float = DEFAULT_TIMEOUT_S) -> DistInfo:
    """Join the process group that the launcher describes in the environment (if any: torchrun's
    variables, or SLURM's for tasks started by srun, see `slurm_environment`), for a run on
    `device` (`auto`: this rank's GPU if there is one, else the CPU; see `taser.runtime.pick_device`).

    The backend follows the device (`default_backend`) unless `backend` names one. The processes
    meet where `torchrun` says (MASTER_ADDR/MASTER_PORT), unless `init_method` or the environment
    variable TASER_DIST_INIT names another rendezvous, e.g. `file:///shared/file` (a file no other
    group uses); RANK and WORLD_SIZE come from the environment either way. A rank waits at most
    `timeout_s` in a collective.
    """
    from datetime import timedelta

    from taser.runtime import pick_device

    os.environ.update(slurm_environment())  # srun's tasks (SLURM, submitit) join as torchrun's would
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo()
    device = pick_device(device)
    started = not dist.is_initialized()
    if started:
        backend = backend or default_backend(device)
        init_method = init_method or os.environ.get(INIT_METHOD_ENV) or None
        timeout = timedelta(seconds=timeout_s)
        if init_method is None:
            dist.init_process_group(backend, timeout=timeout)  # env://, as torchrun sets it up
        else:
            dist.init_process_group(backend, init_method=init_method, rank=int(os.environ["RANK"]), world_size=world, timeout=timeout)
        # A group (or a cached subgroup) left to interpreter shutdown can abort the process there (gloo's worker threads
        # outlive the interpreter: "terminate called without an active exception"); a no-op where the caller destroyed it.
        atexit.register(destroy_distributed)
    info = DistInfo(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")), started_group=started)
    if device.type == "cuda":
        torch.cuda.set_device(device)
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


_HOST_GROUPS: dict[object, object] = {}


def _takes_cpu_tensors() -> bool:
    """Whether the default group has a backend for CPU tensors (gloo, or `cpu:gloo,cuda:nccl`)."""
    config = str(dist.get_backend_config())
    return config == "gloo" or "cpu:" in config


def host_group():
    """A process group for CPU tensors: the default one where it takes them (gloo, or a
    `cpu:gloo,cuda:nccl` group), else a gloo group beside it (NCCL alone takes device tensors
    only). Ranks exchange host-side facts through it without waiting for the device."""
    default = dist.group.WORLD
    if _takes_cpu_tensors():
        return default
    if default not in _HOST_GROUPS:
        _HOST_GROUPS[default] = dist.new_group(backend="gloo")  # collective: every rank reaches this at the same step
    return _HOST_GROUPS[default]


PREPARE_TIMEOUT_S = 48 * 3600  # how long ranks wait for their node's local rank 0 to prepare the data (a hub dataset: hours)


def preparation_group():
    """A gloo group of every rank that waits up to PREPARE_TIMEOUT_S in a collective: the other ranks
    of a node wait in it while local rank 0 prepares the data, however long that takes beyond the
    default group's timeout (collective: every rank calls it at the same step)."""
    from datetime import timedelta

    key = ("prepare", dist.group.WORLD)
    if key not in _HOST_GROUPS:
        _HOST_GROUPS[key] = dist.new_group(backend="gloo", timeout=timedelta(seconds=PREPARE_TIMEOUT_S))
    return _HOST_GROUPS[key]


def gather_sizes(n: int) -> list[int]:
    """Every rank's `n` (a row count: host-side, so gathered on the CPU, with no device sync)."""
    sizes = [torch.zeros(1, dtype=torch.long) for _ in range(dist.get_world_size())]
    dist.all_gather(sizes, torch.tensor([n], dtype=torch.long), group=host_group())
    return [int(s) for s in sizes]


def gather_with_grad(tensor: torch.Tensor) -> tuple[torch.Tensor, int]:
    """All ranks' rows concatenated in rank order, and where this rank's rows start."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return tensor, 0
    sizes = gather_sizes(len(tensor))
    return _GatherWithGrad.apply(tensor, sizes), sum(sizes[: dist.get_rank()])


def _sum_gradients(state, bucket):  # no annotations: DDP checks them against the real classes
    """DDP communication hook: sum a bucket over ranks (DDP's default divides by the world size;
    each rank's loss is already divided by the global number of questions)."""
    return dist.all_reduce(bucket.buffer(), async_op=True).get_future().then(lambda fut: fut.value()[0])


def data_parallel(model: torch.nn.Module, find_unused_parameters: bool) -> torch.nn.Module:
    """`model` under torch's DistributedDataParallel when a process group is up, else `model`.

    Gradients are summed (not averaged) in buckets that overlap the backward pass. A parameter
    no rank used keeps no gradient, as in a single process; one used on some ranks only (an
    expert that got no tokens here) counts as zero where it was unused. `find_unused_parameters`
    is needed when a forward pass may leave parameters out (an encoder's unused pooler, TASER's
    experts, gradient caching's one-side chunks).
    """
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return model
    from torch.nn.parallel import DistributedDataParallel

    device_ids = [next(model.parameters()).device.index] if next(model.parameters()).is_cuda else None
    ddp = DistributedDataParallel(model, device_ids=device_ids, find_unused_parameters=find_unused_parameters, gradient_as_bucket_view=True)
    ddp.register_comm_hook(None, _sum_gradients)
    return ddp


def no_sync(model: torch.nn.Module, sync: bool):
    """A context in which a DDP model's backward passes only accumulate (no all-reduce) unless `sync`."""
    if sync or not hasattr(model, "no_sync"):
        return contextlib.nullcontext()
    return model.no_sync()


def all_reduce_sum(values: torch.Tensor) -> torch.Tensor:
    """`values` summed over ranks, on their own device (NCCL reduces device tensors only)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return values
    values = values.clone()
    dist.all_reduce(values)
    return values


def destroy_distributed() -> None:
    """Leave the process group, if one is up (NCCL warns at exit otherwise)."""
    if dist.is_available() and dist.is_initialized():
        _HOST_GROUPS.clear()
        dist.destroy_process_group()
