"""Tensors of 2 MB and more on transparent huge pages (Linux), for CPU training.

A training step allocates and frees its activations and gradients every step. glibc returns the
large ones to the kernel when they are freed (the word embeddings' 47 MB gradient among them), so
each step faults their pages in again, 4 KB at a time: 30,000-40,000 page faults and about 0.2
CPU-second a step at the demo's settings in fp32 (`benchmarks/peers/roofline.py`). PyTorch's
allocator advises the kernel to back tensors of 2 MB and more with huge pages when
`THP_MEM_ALLOC_ENABLE` is set in the environment at its first allocation; then a step faults a
few thousand times.

`request()` sets it where it measured faster: on a CPU without native bf16 instructions, whose
training runs in fp32 (`precision=auto`), and where the kernel lends huge pages to processes that
ask (`always` or `madvise` in /sys/kernel/mm/transparent_hugepage/enabled). On a CPU with native
bf16 the bf16 step measured slower with them (the cause was not isolated), so there it leaves
them off. The figures: `benchmarks/peers/results.md`, "The roofline". The environment has the last word: `THP_MEM_ALLOC_ENABLE=1`
or `=0` is never overridden. The scripts call it on import of `taser.cli`, before torch allocates
anything; a program of one's own calls it first thing. `active()` measures what took effect (the
kernel may have no huge page free), recorded with the hardware of every run.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ENV = "THP_MEM_ALLOC_ENABLE"
KERNEL_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")
CPUINFO = Path("/proc/cpuinfo")
BF16_FLAGS = ("avx512_bf16", "amx_bf16", "amx_tile")
SMALL_PAGE, PROBE_BYTES = 4096, 64 << 20


def kernel_mode(setting: Path = KERNEL_SETTING) -> str | None:
    """The kernel's transparent huge page mode ('always', 'madvise', 'never'); None off Linux."""
    try:
        text = setting.read_text()
    except OSError:
        return None
    start, end = text.find("["), text.find("]")
    return text[start + 1:end] if 0 <= start < end else None


def native_bf16(cpuinfo: Path = CPUINFO) -> bool:
    """Whether the CPU flags name bf16 matrix instructions (AVX512-BF16 or AMX), read without
    importing torch (which `taser.runtime.cpu_has_native_bf16` asks, for the same answer)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return False
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    return any(flag in flags for flag in BF16_FLAGS)


def request(setting: Path = KERNEL_SETTING, cpuinfo: Path = CPUINFO) -> bool:
    """Ask PyTorch for huge pages where they measured faster (see the module docstring) and the
    environment is silent. Takes effect only before the process's first tensor allocation. True
    when it set the variable."""
    if ENV in os.environ or not sys.platform.startswith("linux") or kernel_mode(setting) not in ("always", "madvise"):
        return False
    if native_bf16(cpuinfo):
        return False
    os.environ[ENV] = "1"
    return True


def active() -> bool:
    """Whether a fresh large CPU tensor lands on huge pages: 64 MB (above glibc's largest mmap
    threshold, so mapped afresh) touched once faults 16,384 times on 4 KB pages, 32 on 2 MB pages."""
    try:
        import resource
    except ImportError:  # not a Unix
        return False
    import torch

    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    probe = torch.ones(PROBE_BYTES, dtype=torch.uint8)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    del probe
    return faults < PROBE_BYTES // SMALL_PAGE // 8
