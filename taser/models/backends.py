"""Which engine runs encoding (inference only): PyTorch, or ONNX Runtime in float32 or with int8
weights (`taser.models.onnx_backend`, the optional `fast` extra). Light: no torch, so config
schemas can name the choice.

`auto` picks, among the backends installed here, the one recorded fastest on CPU within the
accuracy gate (top-20 on the SQuAD protocol within 0.5 point of `torch`, nDCG@10 within 0.005):
`AUTO_ORDER` lists the backends that passed, fastest first, from `benchmarks/peers/encode_results.md`.
Until a backend has passed there, `auto` is `torch`. A backend chosen by hand that failed the gate
says so when it loads. On a GPU, `auto` is always `torch`.
"""

from __future__ import annotations

import logging

from taser.choice import Choice

log = logging.getLogger(__name__)


class Backend(Choice):
    auto = "auto"
    torch = "torch"  # PyTorch: exact, every device
    onnx = "onnx"  # ONNX Runtime, float32, graph optimisations (CPU)
    onnx_int8 = "onnx_int8"  # ONNX Runtime, int8 MatMul weights, dynamic activation quantisation (CPU)


# From benchmarks/peers/encode_results.md (AMD EPYC, AVX2, fp32, 2 cores; fused graphs, recipes onnx 2 /
# onnx_int8 3): `onnx` keeps every figure of torch (cosine 1.00000) at 1.10x its passages/s and 1.26x its
# questions/s. `onnx_int8` is 1.31x / 1.38x torch and keeps trained dpr's and taser's top-20 within 0.2 point,
# but the zero-shot model's nDCG@10 on the tiny BEIR fixture falls 0.80 -> 0.79: one of its 6 queries swaps a
# relevant and an irrelevant document that torch scores 0.0018 apart (sentence-transformers' own int8 loses
# the same). The gate says fail; so `auto` takes `onnx`.
AUTO_ORDER: tuple[Backend, ...] = (Backend.onnx,)  # passed the accuracy gate and beat torch on CPU, fastest first
FAILED_GATE: dict[Backend, str] = {  # backend -> what the recorded measurement found
    Backend.onnx_int8: "zero-shot nDCG@10 on the tiny BEIR fixture 0.7900 vs 0.8000 (one near-tie of 6 queries swapped); "
    "top-20 of trained dpr / taser within 0.2 point (benchmarks/peers/encode_results.md)",
}


# How each ONNX backend's graphs are made, (name, version) (`taser.models.onnx_backend`): a graph cache,
# an embeddings shard or an index made by another version is not mixed with this one's. float32 2 / int8 3:
# explicit attention fused by ONNX Runtime's transformer optimizer (1 / 2: PyTorch's SDPA as exported).
# int8 2 and 3: unsigned weights, FFN down-projections kept in float32 (int8 1, signed weights on every
# MatMul, failed the accuracy gate); the fused attention's QKV projection stays float32. Caches written
# before versions were recorded count as 1.
RECIPES: dict[Backend, tuple[str, int]] = {Backend.onnx: ("fused float32", 2), Backend.onnx_int8: ("fused int8", 3)}


# what a manifest or an index records of how its vectors were computed (backend_record's keys, and the
# precision: a shard resumed in another precision, or an index reused across precisions, would mix vectors)
RECORD_KEYS = ("backend", "backend_recipe", "precision")


def vectors_precision(backend: Backend | str, precision: str, device) -> str:
    """The precision the vectors are computed in: an ONNX Runtime graph's own (fp32), else `precision`
    resolved for `device` (`taser.runtime.resolve_precision`)."""
    from taser.runtime import resolve_precision

    backend = Backend.parse(backend, "backend")
    return resolve_precision(precision, device) if backend == Backend.torch else "fp32"


def backend_record(backend: Backend | str) -> dict:
    """What an embeddings manifest or an index records of the (resolved) backend that made its
    vectors: {} for torch (as before backends existed), else its name and recipe version."""
    backend = Backend.parse(backend, "backend")
    if backend == Backend.auto:
        raise ValueError("backend_record needs the resolved backend, not auto (resolve_backend)")
    return {} if backend == Backend.torch else {"backend": str(backend), "backend_recipe": RECIPES[backend][1]}


def recorded_backend(record: dict) -> dict:
    """The `backend_record` part of a manifest or an index's record ({} for torch's vectors), and its precision."""
    return {k: record[k] for k in RECORD_KEYS if k in record}


def onnx_available() -> bool:
    """Whether the ONNX backends can run here: onnxruntime to run, onnx to export. (Here, not in
    `taser.models.onnx_backend`, which imports this module: one direction of import only.)"""
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError:
        return False
    return True


def installed(backend: Backend) -> bool:
    if backend in (Backend.onnx, Backend.onnx_int8):
        return onnx_available()
    return True


def resolve_backend(backend: Backend | str, device_type: str = "cpu") -> Backend:
    """The backend that will run: `auto` resolved; a backend that cannot run here refused with the reason."""
    backend = Backend.parse(backend, "backend")
    if backend == Backend.auto:
        if device_type != "cpu":
            return Backend.torch
        return next((b for b in AUTO_ORDER if installed(b) and b not in FAILED_GATE), Backend.torch)
    if backend != Backend.torch:
        if device_type != "cpu":
            raise ValueError(f"backend={backend} runs on the CPU only; this run's device is {device_type} (use backend=torch or auto)")
        if not installed(backend):
            raise ValueError(f"backend={backend} needs the optional extra: pip install 'taser[fast]' (onnx and onnxruntime)")
        if backend in FAILED_GATE:
            log.warning("backend=%s did not pass the accuracy gate on the recorded benchmark: %s", backend, FAILED_GATE[backend])
    return backend
