"""What compiled training (`train.compile=true`) decides before torch is imported: the padded
lengths (buckets), where the compiler's caches live, and the settings and machines it refuses.

`torch.compile` specialises a graph to its input shapes. Batches padded to their own longest
input would compile once per distinct length (minutes each on a small CPU); padded up to the
next of a few fixed lengths instead, the encoders compile at most once per bucket and side.
Padded tokens are masked, so the vectors are those of the unbucketed batch (to float rounding).

The compiled graphs land in inductor's caches on disk (its FX graph cache and the AOT autograd
cache): a second run of the same settings reads them instead of compiling again. They are kept
under `train.compile_cache_dir`, by default the user's cache directory, not /tmp.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

ROUND_TO = 8  # bucket lengths are multiples of this (tensor-core and SIMD friendly)


def bucket_lengths(max_length: int, count: int) -> list[int]:
    """`count` evenly spaced lengths up to `max_length`, each rounded up to a multiple of 8 (the
    last is `max_length` itself); fewer when `max_length` is short. 256, 4 -> [64, 128, 192, 256]."""
    if max_length < 1 or count < 1:
        raise ValueError(f"buckets need max_length >= 1 and count >= 1, got {max_length}, {count}")
    lengths = {min(max_length, _round_up(-(-max_length * i // count))) for i in range(1, count + 1)}
    return sorted(lengths)


def _round_up(n: int) -> int:
    return -(-n // ROUND_TO) * ROUND_TO


def bucket_for(length: int, buckets: list[int]) -> int:
    """The smallest bucket holding `length` tokens (the largest bucket when none does: inputs are
    truncated to max_length, which is the largest)."""
    return next((b for b in buckets if b >= length), buckets[-1])


def default_cache_dir() -> Path:
    """$XDG_CACHE_HOME/taser/torch-compile, else ~/.cache/taser/torch-compile."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "taser" / "torch-compile"


def resolve_cache_dir(setting: str | None) -> Path:
    """`train.compile_cache_dir`, else $TORCHINDUCTOR_CACHE_DIR where the user set one, else `default_cache_dir()`."""
    chosen = setting or os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    return Path(chosen).expanduser().resolve() if chosen else default_cache_dir()


def cxx_compiler() -> str | None:
    """The C++ compiler inductor would call ($CXX, else g++; clang++ on macOS), if it is on the
    PATH. Inductor compiles its CPU kernels with it, and Triton its GPU launchers with the C one."""
    name = os.environ.get("CXX") or ("clang++" if sys.platform == "darwin" else "g++")
    return shutil.which(name)


def settings_refusal(grad_cache_chunk: int) -> str | None:
    """Why `train.compile=true` cannot run with these training settings on this machine (None: it can).
    Torch-free, so a refusal comes before any data, model or torch is loaded."""
    if grad_cache_chunk:
        return ("train.compile=true cannot be combined with gradient caching (train.grad_cache_chunk="
                f"{grad_cache_chunk}): its chunks re-encode under replayed random states, one compiled shape per chunk "
                "size; set train.grad_cache_chunk=0 (or use train.grad_accumulation for memory) or train.compile=false")
    if cxx_compiler() is None:
        wanted = os.environ.get("CXX") or ("clang++" if sys.platform == "darwin" else "g++")
        return (f"train.compile=true needs a C++ compiler for torch.compile's inductor, and '{wanted}' is not on the PATH "
                "(install g++, or set CXX to one); or set train.compile=false")
    return None


def model_refusal(unpad: bool | None, learned_routing: bool, device_type: str, has_triton: bool) -> str | None:
    """Why `train.compile=true` cannot run with this model on this device (None: it can)."""
    if unpad:
        return ("train.compile=true cannot run with model.unpad=true: padding-free encoding lays out each batch on the host, "
                "a new shape every batch; set model.unpad=null (compiled steps then run padded, bucketed) or train.compile=false")
    if learned_routing:
        return ("train.compile=true cannot run with TASER's learned routing: its experts take data-dependent numbers of "
                "tokens, a new graph every batch; use model.taser.routing=deterministic or train.compile=false")
    if device_type not in ("cpu", "cuda"):
        return f"train.compile=true is supported on CPUs and CUDA GPUs, not on '{device_type}'; set train.compile=false"
    if device_type == "cuda" and not has_triton:
        return "train.compile=true on a CUDA GPU needs Triton (pip install triton); or set train.compile=false"
    return None
