"""FAISS's import-time messages, replaced by one line naming the instruction set it uses.

While `import faiss` runs, its loader (the `faiss.loader` logger) logs at INFO which of its
per-instruction-set builds it tries, e.g. `Could not load library with AVX2 support due to:
ModuleNotFoundError("No module named 'faiss.swigfaiss_avx2'")`. faiss-cpu >= 1.12 ships one
dynamic-dispatch library (`DD` in its compile options) that picks its SIMD kernels at run time
and has no such per-build module, so with the project's logging at INFO every run printed
those messages although AVX2 (or AVX-512) was in use. `quiet_faiss_loader()` drops the
loader's records and, when the loader reports success, logs one line instead: the version, the
instruction set in use and the compile options. It imports nothing (faiss stays unimported
until an index is needed); `taser.retrieval` calls it before any module of the package can
import faiss.
"""

from __future__ import annotations

import logging
import sys

log = logging.getLogger("taser.retrieval.faiss")

LOADER = "faiss.loader"
LEVELS = ("AVX512_SPR", "AVX512", "AVX2", "SVE", "NEON")  # FAISS's SIMD levels, most specific first
_BUILDS = ("faiss.swigfaiss_avx512_spr", "faiss.swigfaiss_avx512", "faiss.swigfaiss_avx2", "faiss.swigfaiss_sve", "faiss.swigfaiss")


def describe_faiss(swig) -> str:
    """One line: FAISS's version, the instruction set its kernels use, its compile options."""
    options = str(swig.get_compile_options()).strip()
    words = options.split()
    level = next((w for w in words if w in LEVELS), "generic (no SIMD level named)")
    version = getattr(swig, "VERSION_STRING", None) or ".".join(
        str(getattr(swig, f"FAISS_VERSION_{part}", "?")) for part in ("MAJOR", "MINOR", "PATCH")
    )
    dispatch = ", dispatched at run time" if "DD" in words else ""
    return f"FAISS {version} uses {level}{dispatch} (compile options: {options})"


class _LoaderMessages(logging.Filter):
    """Drops the loader's records; on its success record, logs `describe_faiss` once instead."""

    def __init__(self):
        super().__init__()
        self.said = False

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.said and str(record.msg).startswith("Successfully loaded faiss"):
            swig = next((sys.modules[name] for name in _BUILDS if name in sys.modules), None)
            if swig is not None and hasattr(swig, "get_compile_options"):
                self.said = True
                log.info("%s", describe_faiss(swig))
        return False


def quiet_faiss_loader() -> None:
    """Install the filter on FAISS's loader logger (once; harmless when faiss is already imported)."""
    logger = logging.getLogger(LOADER)
    if not any(isinstance(f, _LoaderMessages) for f in logger.filters):
        logger.addFilter(_LoaderMessages())
