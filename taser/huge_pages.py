"""Tensors of 2 MB and more on transparent huge pages (Linux), for CPU training.

A training step allocates and frees its activations and gradients every step. glibc returns the
large ones to the kernel when they are freed (the word embeddings' 47 MB gradient among them), so
each step faults their pages in again, 4 KB at a time: 30,000-40,000 page faults and about 0.2
CPU-second a step at the demo's settings (`benchmarks/peers/roofline.py`). PyTorch's allocator
aligns tensors of 2 MB and more to 2 MB and advises huge pages for them when `THP_MEM_ALLOC_ENABLE`
is set in the environment at its first allocation; then a step faults a few thousand times.

`request()` sets it, unless the environment already says (`THP_MEM_ALLOC_ENABLE=0` keeps it
off), when the kernel lends huge pages to processes that ask (`always` or `madvise` in
/sys/kernel/mm/transparent_hugepage/enabled). The scripts call it on import of `taser.cli`, before
torch allocates anything; a program of one's own calls it first thing. `active()` measures what
took effect (the kernel may have no huge page free), recorded with the hardware of every run.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ENV = "THP_MEM_ALLOC_ENABLE"
KERNEL_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")
SMALL_PAGE, PROBE_BYTES = 4096, 64 << 20


def kernel_mode(setting: Path = KERNEL_SETTING) -> str | None:
    """The kernel's transparent huge page mode ('always', 'madvise', 'never'); None off Linux."""
    try:
        text = setting.read_text()
    except OSError:
        return None
    start, end = text.find("["), text.find("]")
    return text[start + 1:end] if 0 <= start < end else None


def request(setting: Path = KERNEL_SETTING) -> bool:
    """Ask PyTorch for huge pages where the kernel lends them and the environment is silent.
    Takes effect only before the process's first tensor allocation. True when it set the variable."""
    if ENV in os.environ or not sys.platform.startswith("linux") or kernel_mode(setting) not in ("always", "madvise"):
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
