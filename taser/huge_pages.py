"""Whether this process's large CPU tensors land on transparent huge pages (Linux).

PyTorch advises the kernel to back tensors of 2 MB and more with huge pages when
`THP_MEM_ALLOC_ENABLE=1` is in the environment at its first allocation, where the kernel lends
them (`always` or `madvise` in /sys/kernel/mm/transparent_hugepage/enabled). A CPU training step
then faults a few thousand times instead of 30,000-40,000 (the large tensors it frees and
allocates again every step). Measured with `benchmarks/peers/roofline.py --huge-pages-pairs`,
that did not make the step reliably faster (fp32 and bf16, `benchmarks/peers/results.md`, "The
roofline"), so taser does not set it; it records whether it was in effect (`huge_page_tensors`
in the hardware of every run), since it can move speed figures.
"""

from __future__ import annotations

import functools

ENV = "THP_MEM_ALLOC_ENABLE"
SMALL_PAGE, PROBE_BYTES = 4096, 64 << 20


@functools.cache
def active() -> bool:
    """Whether a fresh large CPU tensor lands on huge pages: 64 MB (above glibc's largest mmap
    threshold, so mapped afresh) touched once faults 16,384 times on 4 KB pages, 32 on 2 MB pages.
    Fixed for the life of the process, so probed once."""
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
