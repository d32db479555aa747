"""What the machine has, and the choices that follow from it: device, precision, autocast.

Precision is never fixed in a config: `auto` (the default everywhere) is resolved here, in one
place, from the hardware. bf16 is only a speed-up where the hardware computes it natively
(CUDA GPUs of compute capability 8+, x86 CPUs with AVX512-BF16 or AMX); elsewhere torch
emulates it, hundreds of times slower than fp32 on an AVX2-only CPU.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import os
import platform

import torch

from taser.precision import Precision

log = logging.getLogger(__name__)


PRECISIONS = Precision.names()
_warned: set[tuple[str, str]] = set()


def launcher_local_rank() -> int | None:
    """This process's LOCAL_RANK under a multi-process launcher (torchrun: WORLD_SIZE > 1), else None."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return None
    return int(os.environ.get("LOCAL_RANK", "0"))


def pick_device(name: str | torch.device = "auto") -> torch.device:
    """`auto`: a GPU if there is one, else the CPU. Under torchrun each process takes the GPU of
    its LOCAL_RANK (`auto` and `cuda` alike), or the one GPU it sees when the launcher gives each
    task its own (SLURM's --gpus-per-task=1); an explicit other index is refused, since every
    process would then share one GPU."""
    if isinstance(name, torch.device):
        device = name
    elif name == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(name)
    local = launcher_local_rank()
    if device.type != "cuda" or local is None:
        return device
    count = torch.cuda.device_count()
    if "TORCHELASTIC_RUN_ID" in os.environ and local >= count:  # torchrun starts ranks that all see the same GPUs
        raise ValueError(f"torchrun started local rank {local} on a machine that shows {count} GPU(s): start at most {count} "
                         "processes per machine (torchrun --nproc_per_node, or processes=N), or check CUDA_VISIBLE_DEVICES")
    own = local >= count == 1  # the launcher gave this task a GPU of its own (SLURM --gpus-per-task=1, CUDA_VISIBLE_DEVICES per rank)
    mine = 0 if own else local
    if device.index is not None and device.index != mine:
        raise ValueError(
            f"device={name} contradicts this process's LOCAL_RANK={local} under torchrun: every process would share "
            f"GPU {device.index}; use device=auto or device=cuda (each process then takes cuda:LOCAL_RANK)")
    if own:
        _warn_once("one-gpu-per-task", f"LOCAL_RANK={local} sees one GPU: taking it (each task was given its own)", logging.INFO)
        return torch.device("cuda", 0)
    if local >= count:
        raise ValueError(f"LOCAL_RANK={local} but this machine shows {count} GPU(s): start at most {count} processes per machine "
                         "(torchrun --nproc_per_node), or check CUDA_VISIBLE_DEVICES")
    return torch.device("cuda", local)


def cpu_has_native_bf16() -> bool:
    """AVX512-BF16 or AMX: the x86 instructions that compute bf16 matrix products natively."""
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def cuda_has_bf16() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False)


@functools.lru_cache(maxsize=1)
def cpu_model() -> str:
    """The CPU's marketing name ('AMD EPYC', 'Intel(R) Xeon(R) ...'), or the architecture."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


HUGE_PAGES_ENV = "THP_MEM_ALLOC_ENABLE"


@functools.cache
def huge_page_tensors() -> bool:
    """Whether this process's large CPU tensors land on transparent huge pages (Linux): PyTorch asks
    for them when `THP_MEM_ALLOC_ENABLE=1` is in the environment at its first allocation. taser
    does not set it (measured not to make a training step reliably faster: benchmarks/peers/results.md,
    "The roofline") but records it, since it moves speed figures. A fresh 64 MB tensor (above glibc's
    largest mmap threshold, so mapped afresh) touched once faults 16,384 times on 4 KB pages and 32
    on 2 MB pages; fixed for the life of the process, so probed once."""
    try:
        import resource
    except ImportError:  # not a Unix
        return False
    probe_bytes = 64 << 20
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    probe = torch.ones(probe_bytes, dtype=torch.uint8)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    del probe
    return faults < probe_bytes // 4096 // 8


FREED_MEMORY_ENV = "TASER_KEEP_FREED_MEMORY"
_GLIBC_MALLOC_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "GLIBC_TUNABLES")
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)
_KEPT_THRESHOLD = 1 << 30


@functools.cache
def keep_freed_memory() -> bool:
    """Make glibc's malloc keep freed memory for reuse rather than hand it back to the kernel
    (mallopt: mmap threshold and trim threshold 1 GiB); True if it now does.

    A CPU training step frees and allocates activations of a few to ~50 MB (an embedding's
    gradient is 47 MB for BERT's vocabulary), sized by each batch's token count. By default
    glibc maps blocks above its mmap threshold (which rises to 32 MB at most) afresh and trims the
    heap's free top, so every step faults its memory back in, page by page, and the kernel zeroes
    it: 25,000-50,000 page faults and 0.16-0.33 s of system time a step at the demo's settings on 2
    cores (fp32), a few to a few thousand once the memory is kept; the `Trainer`'s steps ran 1.055x
    faster at the median of 7 pairs of processes (`benchmarks/peers/results.md`, "The roofline").
    The process's resident memory then stays at its peak, which a training run reaches anyway.

    Left alone where the environment already tunes glibc's malloc (`MALLOC_*_` variables,
    `GLIBC_TUNABLES`), where `TASER_KEEP_FREED_MEMORY=0`, and off glibc (macOS, Windows, musl).
    Process-wide and not undone, so done once."""
    if os.environ.get(FREED_MEMORY_ENV, "1") == "0" or any(name in os.environ for name in _GLIBC_MALLOC_ENV):
        return False
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    huge_page_tensors()  # probed first: once freed memory is kept, its fresh block may not be fresh
    kept = bool(mallopt(_M_MMAP_THRESHOLD, _KEPT_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, _KEPT_THRESHOLD))
    log.debug("glibc malloc keeps freed memory: %s", kept)
    return kept


def freed_memory_kept() -> bool:
    """Whether `keep_freed_memory` has taken effect in this process (without making it so)."""
    return keep_freed_memory.cache_info().currsize > 0 and keep_freed_memory()


def hardware(device: str | torch.device = "auto") -> dict:
    """The facts every recorded figure is quoted with: CPU model and capability, cores, GPU."""
    device = pick_device(device)
    info = {
        "cpu": cpu_model(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_native_bf16": cpu_has_native_bf16(),
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "huge_page_tensors": huge_page_tensors(),
        "freed_memory_kept": freed_memory_kept(),
        "device": device.type,
        "torch": torch.__version__,
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["gpu_bf16"] = cuda_has_bf16()
    return info


def describe_hardware(device: str | torch.device = "auto") -> str:
    """One line: 'AMD EPYC (AVX2, no native bf16), 2 cores' [+ ', GPU NVIDIA H200']."""
    h = hardware(device)
    text = f"{h['cpu']} ({h['cpu_capability']}, {'native' if h['cpu_native_bf16'] else 'no native'} bf16), {h['cores']} cores"
    return text + (f", GPU {h['gpu']}" if "gpu" in h else "")


def resolve_precision(precision: str, device: str | torch.device = "auto") -> str:
    """`auto` -> what this hardware runs fastest at fine-tuning accuracy; anything else as given.

    CUDA with bf16 -> bf16; CUDA without -> fp16 (with a gradient scaler); a CPU with native
    bf16 -> bf16; any other CPU -> fp32. An explicit bf16 where the CPU lacks it is honoured, with
    one warning per process.
    """
    precision = Precision.parse(precision, "precision").value
    device = pick_device(device)
    if device.type == "cuda":
        if precision == "auto":
            return "bf16" if cuda_has_bf16() else "fp16"
        if precision == "bf16" and not cuda_has_bf16():
            _warn_once("bf16-cuda-emulated", (
                f"precision bf16 on a GPU without native bf16 ({torch.cuda.get_device_name(device)}): it is emulated and slow, "
                "or fails in some kernels. Set precision=auto (fp16 with a gradient scaler here)."))
        return precision
    if precision == "fp16":
        raise ValueError(f"precision fp16 needs a CUDA GPU (device is {device.type}); use precision=auto")
    if device.type != "cpu":
        return "fp32" if precision == "auto" else precision
    native = cpu_has_native_bf16()
    if precision == "auto":
        return "bf16" if native else "fp32"
    if precision == "bf16" and not native:
        _warn_once("bf16-emulated", (
            f"precision bf16 on a CPU without native bf16 ({cpu_model()}, capability "
            f"{torch.backends.cpu.get_cpu_capability()}): torch emulates it, often 50-300x slower than fp32. "
            "Set precision=auto (fp32 here) unless you mean to measure bf16 itself."))
    return precision


def _warn_once(key: str, message: str, level: int = logging.WARNING) -> None:
    if (key, message) in _warned:
        return
    _warned.add((key, message))
    log.log(level, message)


def autocast(precision: str, device: torch.device):
    """The autocast context of `precision` (resolved first: `auto` is accepted)."""
    precision = resolve_precision(precision, device)
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


def grad_scaler(precision: str, device: torch.device):
    """A GradScaler for fp16 (bf16 and fp32 need none)."""
    if resolve_precision(precision, device) == "fp16":
        return torch.amp.GradScaler(device.type)
    return None


def precision_record(precision: str, device: str | torch.device = "auto") -> dict:
    """What a run writes beside its results: the precision asked for, the one used, the hardware."""
    return {"precision_requested": precision, "precision": resolve_precision(precision, device), "hardware": hardware(device)}


def training_record(precision: str, device: torch.device) -> dict:
    """`precision_record` for a training run, which on a CPU first keeps freed memory (`keep_freed_memory`)."""
    if device.type == "cpu":
        keep_freed_memory()
    return precision_record(precision, device)
