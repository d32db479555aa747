"""Which engine runs encoding (inference only): PyTorch, or ONNX Runtime in float32 or with int8
weights (`taser.models.onnx_backend`, the optional `fast` extra). Light: no torch, so config
schemas can name the choice.

`auto` picks, among the backends installed here, the one recorded fastest on CPU that passed the
accuracy gate (`taser.evaluation.encoding_gate`; the rule: docs/encoding.md, "The accuracy gate"):
`AUTO_ORDER` lists the backends that passed, fastest first, from `benchmarks/peers/encode_results.md`.
Until a backend has passed there, `auto` is `torch`. A backend chosen by hand that did not pass (it
failed, or the gate was undecided) says why when it loads. On a GPU, `auto` is always `torch`.
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
    onnx_int8_static = "onnx_int8_static"  # ONNX Runtime, int8 MatMul weights and activations, ranges calibrated once (CPU)
    onnx_int8_qkv = "onnx_int8_qkv"  # onnx_int8, and the fused attention's QKV projection in int8 (QAttention) (CPU)



# Speed, from benchmarks/peers/encode_results.md (AMD EPYC, AVX512, fp32, 2 cores; fused graphs): `onnx` 1.79x torch's
# passages/s and 1.57x its questions/s; `onnx_int8` 1.88x / 1.73x, `onnx_int8_static` 1.97x / 1.47x, `onnx_int8_qkv`
# 1.93x / 1.85x. Accuracy, from the gate with power in the same file (same machine, fp32 encoding; per-question paired
# tests against torch on a dpr and a taser trained 50 steps, docs/encoding.md "The accuracy gate"): `onnx` passes
# (every one of the 1,971 questions and 1,953 squad-beir queries ties with torch). No int8 recipe has passed: static
# int8 failed (taser top-1 -0.76 point), dynamic int8 and int8 QKV are undecided (their top-1 churn, 36-68 questions
# differing, leaves 1,971 questions unable to see a top-1 loss under 1 point). So `auto` takes `onnx`.
AUTO_ORDER: tuple[Backend, ...] = (Backend.onnx,)  # passed the accuracy gate and beat torch on CPU, fastest first
FAILED_GATE: dict[Backend, str] = {  # backend -> why it has not passed the gate (failed, or undecided), as recorded
    Backend.onnx_int8: "undecided by the accuracy gate with power: no significant loss on the trained dpr and taser (top-20 +0.00 / "
    "-0.15 point), but its churn (36-51 questions differ in top-1) lets 1,971 questions see only top-1 losses >= 1.17 (dpr) / 0.99 "
    "(taser) point, the taser's top-20 >= 0.59 and the dpr's nDCG@10 >= 0.0054, above the bounds 0.5 / 0.005 "
    "(benchmarks/peers/encode_results.md)",
    Backend.onnx_int8_static: "failed the accuracy gate: the trained taser's top-1 lost 0.76 point, beyond the bound 0.5 (one-sided "
    "p 0.02, Holm 0.10); its other checks undecided (benchmarks/peers/encode_results.md)",
    Backend.onnx_int8_qkv: "undecided by the accuracy gate with power: no significant loss on the trained dpr and taser (top-20 +0.00 / "
    "-0.36 point, Holm p 0.28), but its churn (57-68 questions differ in top-1) lets 1,971 questions see only top-1 losses >= 1.35 "
    "(dpr) / 1.24 (taser) point, the taser's top-20 >= 0.59 and nDCG@10 >= 0.0061 / 0.0058, above the bounds 0.5 / 0.005 "
    "(benchmarks/peers/encode_results.md)",
}


# How each ONNX backend's graphs are made, (name, version) (`taser.models.onnx_backend`): a graph cache,
# an embeddings shard or an index made by another version is not mixed with this one's. float32 2 / int8 3:
# explicit attention fused by ONNX Runtime's transformer optimizer (1 / 2: PyTorch's SDPA as exported).
# int8 2 and 3: unsigned weights, FFN down-projections kept in float32 (int8 1, signed weights on every
# MatMul, failed the accuracy gate); the fused attention's QKV projection stays float32. Caches written
# before versions were recorded count as 1.
# static int8 1: recipe int8 3's MatMuls (FFN down-projections and the attention's QKV float32), int8 activations with
# ranges calibrated (MinMax) on taser.models.calibration_texts, the digest of those texts recorded beside the graphs.
# int8 QKV 1: recipe int8 3 and the fused attentions as QAttention (int8 QKV projection).
RECIPES: dict[Backend, tuple[str, int]] = {Backend.onnx: ("fused float32", 2), Backend.onnx_int8: ("fused int8", 3),
                                           Backend.onnx_int8_static: ("fused static int8", 1),
                                           Backend.onnx_int8_qkv: ("fused int8 with int8 attention QKV", 1)}
ONNX_BACKENDS: tuple[str, ...] = tuple(str(b) for b in RECIPES)  # those run by taser.models.onnx_backend: every backend with a recipe


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
    if str(backend) in ONNX_BACKENDS:
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
