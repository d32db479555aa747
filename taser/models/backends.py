"""Which engine runs encoding (inference only): PyTorch, or ONNX Runtime in float32 or with int8
weights (`taser.models.onnx_backend`, the optional `fast` extra). Light: no torch, so config
schemas can name the choice.

`auto` picks, among the backends installed here, the one recorded fastest on CPU within the
accuracy gate (top-20 on the SQuAD protocol within 0.5 point of `torch`, nDCG@10 within 0.005):
`AUTO_ORDER` lists the backends that passed, fastest first, from `benchmarks/peers/results.md`.
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


# From benchmarks/peers/encode_results*.md (AMD EPYC, AVX2, fp32, 2 cores): `onnx_int8` (recipe 2: unsigned
# per-channel weights, FFN down-projections in float32) kept trained dpr's and taser's top-20 within 0.1 point
# and nDCG@10 equal, at 1.13x torch's passages/s and 1.20x its questions/s; `onnx` kept every figure but did
# not beat torch beyond noise (twice the peak RSS). Recipe 1 (every MatMul int8) failed: dpr top-20 -0.6.
AUTO_ORDER: tuple[Backend, ...] = (Backend.onnx_int8,)  # passed the accuracy gate and beat torch on CPU, fastest first
FAILED_GATE: dict[Backend, str] = {}  # backend -> what the recorded measurement found


def installed(backend: Backend) -> bool:
    if backend in (Backend.onnx, Backend.onnx_int8):
        from taser.models.onnx_backend import onnx_available

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
