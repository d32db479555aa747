"""Which engine runs encoding (inference only): PyTorch; ONNX Runtime in float32 or with int8
weights (`taser.models.onnx_backend`, the optional `fast` extra); or OpenVINO Runtime in float32, bf16
int8, or int8 with what stays float computed in bf16 (`taser.models.openvino_backend`, the optional `openvino`
extra). Light: no torch, so config
schemas can name the choice.

`auto` picks, among the backends installed here, the fastest that passed the accuracy gate
(`taser.evaluation.encoding_gate`; the rule: docs/encoding.md, "The accuracy gate") on this CPU kind,
from the record the encoding benchmark writes per CPU kind (`taser.models.backend_choice`); on a CPU
kind with no record, the fastest exact (float32) backend. It logs which and why. A backend chosen by
hand that did not pass on this CPU kind (it failed, or the gate was undecided) says why when it
loads. On a GPU, `auto` is always `torch`.
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
    openvino = "openvino"  # OpenVINO Runtime, float32 (CPU)
    openvino_bf16 = "openvino_bf16"  # OpenVINO Runtime, computed in bf16 (CPUs with native bf16)
    openvino_int8 = "openvino_int8"  # OpenVINO Runtime, int8 weights and activations by NNCF, ranges calibrated once (CPU)
    openvino_int8_bf16 = "openvino_int8_bf16"  # openvino_int8's models, what they leave in float computed in bf16 (CPUs with native bf16)


# How each ONNX backend's graphs are made, (name, version) (`taser.models.onnx_backend`): a graph cache,
# an embeddings shard or an index made by another version is not mixed with this one's. float32 2 / int8 3:
# explicit attention fused by ONNX Runtime's transformer optimizer (1 / 2: PyTorch's SDPA as exported).
# int8 2 and 3: unsigned weights, FFN down-projections kept in float32 (int8 1, signed weights on every
# MatMul, failed the accuracy gate); the fused attention's QKV projection stays float32. Caches written
# before versions were recorded count as 1.
# static int8 1: recipe int8 3's MatMuls (FFN down-projections and the attention's QKV float32), int8 activations with
# ranges calibrated (MinMax) on taser.models.calibration_texts, the digest of those texts recorded beside the graphs.
# int8 QKV 1: recipe int8 3 and the fused attentions as QAttention (int8 QKV projection).
# OpenVINO 1 (`taser.models.openvino_backend`): the PyTorch frontend's conversion of each side (SDPA attention), saved
# uncompressed; int8 1: NNCF's post-training quantisation for transformers (its defaults), calibrated on the calibration texts.
# float32 3 / int8 4 / static int8 2 / int8 QKV 2: learned routing exported with every expert, each unit keeping its own
# expert's output (taser.models.moe._dispatch_traced); before, the trace froze the example's split by expert into the graph
# and a TASER with learned routing got wrong vectors. Deterministic routing's graphs are unchanged.
# A bf16 variant compiles its float sibling's models (`CONVERTED_AS`) in bf16: its version is its sibling's.
RECIPES: dict[Backend, tuple[str, int]] = {Backend.onnx: ("fused float32", 3), Backend.onnx_int8: ("fused int8", 4),
                                           Backend.onnx_int8_static: ("fused static int8", 2),
                                           Backend.onnx_int8_qkv: ("fused int8 with int8 attention QKV", 2),
                                           Backend.openvino: ("OpenVINO float32", 1), Backend.openvino_bf16: ("OpenVINO bf16", 1),
                                           Backend.openvino_int8: ("OpenVINO NNCF int8, SmoothQuant 0.75, the first FFN output in float", 2),
                                           Backend.openvino_int8_bf16: ("OpenVINO NNCF int8 as openvino_int8, its float operations in bf16", 2)}
ONNX_BACKENDS: tuple[str, ...] = tuple(str(b) for b in RECIPES if str(b).startswith("onnx"))  # run by taser.models.onnx_backend
OPENVINO_BACKENDS: tuple[str, ...] = tuple(str(b) for b in RECIPES if str(b).startswith("openvino"))  # by taser.models.openvino_backend
# the precision a backend's vectors are computed in, where it is its own (the ONNX graphs' float32, OpenVINO's stated precision);
# for an int8 backend, that of the operations left unquantised (its name says int8; recorded with its recipe version)
ENGINE_PRECISION: dict[str, str] = {**{b: "fp32" for b in ONNX_BACKENDS}, "openvino": "fp32", "openvino_bf16": "bf16", "openvino_int8": "fp32",
                                    "openvino_int8_bf16": "bf16"}
# the backends whose models NNCF quantises (with nncf installed, calibrated on the calibration texts)
OPENVINO_INT8: tuple[str, ...] = ("openvino_int8", "openvino_int8_bf16")
# a bf16 variant runs the models of its float sibling, compiled in bf16: one conversion (and one calibration) serves both
CONVERTED_AS: dict[str, str] = {"openvino_bf16": "openvino", "openvino_int8_bf16": "openvino_int8"}


# what a manifest or an index records of how its vectors were computed (backend_record's keys, and the
# precision: a shard resumed in another precision, or an index reused across precisions, would mix vectors)
RECORD_KEYS = ("backend", "backend_recipe", "precision")


def recipe_versions() -> dict[str, int]:
    """Each CPU engine backend's recipe version in this version of taser, by name."""
    return {str(b): version for b, (_, version) in RECIPES.items()}


def vectors_precision(backend: Backend | str, precision: str, device) -> str:
    """The precision the vectors are computed in: a CPU engine's own (`ENGINE_PRECISION`), else
    `precision` resolved for `device` (`taser.runtime.resolve_precision`)."""
    from taser.runtime import resolve_precision

    backend = Backend.parse(backend, "backend")
    return resolve_precision(precision, device) if backend == Backend.torch else ENGINE_PRECISION[str(backend)]


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


def openvino_available(backend: Backend | str = "openvino") -> bool:
    """Whether an OpenVINO backend can run here: openvino to convert and run, and nncf to quantise (int8).
    Looked up, not imported: importing nncf sets up its own logging, which a check must not do."""
    from importlib.util import find_spec

    return find_spec("openvino") is not None and (str(backend) not in OPENVINO_INT8 or find_spec("nncf") is not None)


def installed(backend: Backend) -> bool:
    if str(backend) in ONNX_BACKENDS:
        return onnx_available()
    if str(backend) in OPENVINO_BACKENDS:
        return openvino_available(backend)
    return True


def _extra(backend: Backend) -> str:
    if str(backend) in OPENVINO_BACKENDS:
        return "pip install 'taser-retrieval[openvino]' (openvino, and nncf for int8)"
    return "pip install 'taser-retrieval[fast]' (onnx and onnxruntime)"


_SAID: set[tuple[int, str]] = set()


def _say_once(level: int, message: str) -> None:
    """Log `message` the first time only: one run resolves its backend at each stage that loads it (evaluate, encode,
    load), and the same choice said three times reads like three choices."""
    if (level, message) not in _SAID:
        _SAID.add((level, message))
        log.log(level, message)


def resolve_backend(backend: Backend | str, device_type: str = "cpu") -> Backend:
    """The backend that will run: `auto` resolved; a backend that cannot run here refused with the reason."""
    from taser.models import backend_choice

    backend = Backend.parse(backend, "backend")
    if backend == Backend.auto:
        if device_type != "cpu":
            return Backend.torch
        kind = backend_choice.this_cpu()
        known = Backend.names()
        chosen, why = backend_choice.choose(kind, lambda b: b in known and installed(Backend(b)), recipe_versions())  # a record's unknown name: skipped
        _say_once(logging.INFO, f"backend=auto -> {chosen}: {why}")
        return Backend(chosen)
    if backend != Backend.torch:
        if device_type != "cpu":
            raise ValueError(f"backend={backend} runs on the CPU only; this run's device is {device_type} (use backend=torch or auto)")
        if not installed(backend):
            raise ValueError(f"backend={backend} needs the optional extra: {_extra(backend)}")
        kind = backend_choice.this_cpu()
        verdict = backend_choice.gate_of(str(backend), kind, recipe_versions())
        if verdict is None:
            _say_once(logging.INFO, f"backend={backend} has no accuracy-gate verdict recorded for {kind.describe()} "
                                    "(benchmarks/peers/encode.py records one)")
        elif verdict != backend_choice.PASSES:
            _say_once(logging.WARNING, f"backend={backend} did not pass the accuracy gate recorded for {kind.describe()}: {verdict}")
    return backend
