"""Encoding through OpenVINO Runtime instead of PyTorch (inference only, CPU): a checkpoint's question
and passage encoders converted once to OpenVINO models by its PyTorch frontend, in float32
(`openvino`), computed in bf16 (`openvino_bf16`), or with int8 weights and activations quantised by
NNCF's post-training quantisation, calibrated on the shipped calibration texts (`openvino_int8`:
its settings for transformers, which also store the embedding tables in int8, weights only, with
two choices of its own: `quantize_int8`), and those int8 models with what they leave in float
computed in bf16 (`openvino_int8_bf16`).

Each side is its own model from token ids and attention mask to the final vector, traced through
`BiEncoder.encode(..., side)`: TASER's question model holds the question experts only, its passage
model the passage experts only. Batch and length are dynamic, so taser's own batching (length-sorted,
padded to the longest of each batch) runs unchanged; the attention is OpenVINO's own
`ScaledDotProductAttention` with the padding mask.

OpenVINO's CPU plugin computes in bf16 by itself on a CPU with native bf16 (its default inference
precision there): each backend states its precision instead (`INFERENCE_PRECISION`), so the maths is
what the backend's name says. A bf16 backend is refused on a CPU without native bf16, where it would
silently run in float32. A bf16 backend compiles its float sibling's models (`CONVERTED_AS`): the
conversion, and int8's calibration, are done once for both.

The models are cached beside the checkpoint (`taser.models.graph_cache`) with the weights' identity,
the recipe version (`taser.models.backends.RECIPES`) and, for int8, the calibration texts' digest.
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path

import numpy as np
import torch

from taser.io import atomic_dir
from taser.models.backends import CONVERTED_AS, ENGINE_PRECISION, OPENVINO_BACKENDS, OPENVINO_INT8, RECIPES, openvino_available  # noqa: F401 (openvino_available: this module's interface)
from taser.models.graph_cache import META_FILE, SIDES, GraphEncoder, Side, cache_root, calibration_digest, stale_reason, weights_digest

log = logging.getLogger(__name__)

# the precision each backend computes in, as OpenVINO's INFERENCE_PRECISION_HINT names it (int8's unquantised operations: float32)
INFERENCE_PRECISION = {"fp32": "f32", "bf16": "bf16"}


def convert_side(model, side: str):
    """`model`'s `side` encoder as an OpenVINO model (batch and length dynamic), float32, padded."""
    import openvino as ov

    model = model.float().cpu().eval()
    unpad = model.unpad
    try:
        model.unpad = False  # the padded path: no data-dependent shapes in the graph
        example = (torch.full((2, 16), 1000, dtype=torch.long), torch.ones((2, 16), dtype=torch.long))
        example[1][1, 8:] = 0
        shape = ov.PartialShape([-1, -1])
        with torch.no_grad():
            converted = ov.convert_model(Side(model, side), example_input=example,
                                         input=[("input_ids", shape, ov.Type.i64), ("attention_mask", shape, ov.Type.i64)])  # fmt: skip
    finally:
        model.unpad = unpad
    converted.outputs[0].get_tensor().set_names({"vectors"})
    return converted


# openvino_int8's recipe 2: NNCF's transformer defaults but for two choices, made on the churn of each candidate's first hit
# against torch over questions the gate never reads (benchmarks/peers/int8_recipes.py, int8_recipes.md): SmoothQuant's
# alpha of the matrix products, and the first block's FFN output product left in float. That product reads the GELU's
# output, whose outliers int8 ranges serve worst, and the error it makes there runs through every block above it.
SMOOTH_QUANT_ALPHA = 0.75
FLOAT_MATMULS = re.compile(r"\.encoder\.layer\.0\.output\.(?:experts\.\d+\.output\.)?dense/")


def float_matmuls(converted, pattern: re.Pattern = FLOAT_MATMULS) -> list[str]:
    """The names of the MatMuls whose names match `pattern`, which `quantize_int8` leaves in float (by
    default the first block's FFN output product, of each expert where that block is specialised). A
    model without one is refused, not quantised by another recipe than its cache would record."""
    names = [op.get_friendly_name() for op in converted.get_ordered_ops() if op.get_type_name() == "MatMul"]
    kept = [name for name in names if pattern.search(name)]
    if not kept:
        raise ValueError(f"openvino_int8 keeps the matrix products matching {pattern.pattern!r} in float (the first block's FFN "
                         f"output product of a BERT-family encoder), and this model has none: its first ones are {names[:8]}")  # fmt: skip
    return kept


def quantize_int8(converted, feeds: list[dict], smooth_quant_alpha: float = SMOOTH_QUANT_ALPHA, keep_float: re.Pattern | None = FLOAT_MATMULS):
    """int8 weights and activations of the MatMuls but those `keep_float` names, and int8 embedding
    tables (weights only): NNCF's post-training quantisation for transformers, its activation ranges
    calibrated on `feeds`, SmoothQuant at `smooth_quant_alpha`; the softmax, LayerNorm and GELU run in
    float. The defaults are the recipe of `openvino_int8`; benchmarks/peers/int8_recipes.py tries others."""
    import nncf
    from nncf.quantization.advanced_parameters import AdvancedQuantizationParameters, AdvancedSmoothQuantParameters

    if not feeds:
        raise ValueError("openvino_int8 needs at least one calibration batch")
    ignored = nncf.IgnoredScope(names=float_matmuls(converted, keep_float)) if keep_float is not None else None
    smooth = AdvancedSmoothQuantParameters(matmul=smooth_quant_alpha)
    return nncf.quantize(converted, nncf.Dataset(feeds), model_type=nncf.ModelType.TRANSFORMER, subset_size=len(feeds), ignored_scope=ignored,
                         advanced_parameters=AdvancedQuantizationParameters(smooth_quant_alphas=smooth))  # fmt: skip


def _versions() -> dict:
    import openvino

    versions = {"torch": torch.__version__, "openvino": openvino.__version__}
    try:
        import nncf

        versions["nncf"] = nncf.__version__
    except ImportError:
        pass
    return versions


def prepare_models(checkpoint: str | os.PathLike, backend: str) -> Path:
    """The cache directory holding `<side>.xml` (and `.bin`) for both sides of `checkpoint` under
    `backend` (one of `OPENVINO_BACKENDS`; a bf16 variant's are its float sibling's), converted now
    when missing, written for other weights, made by another recipe, or (int8) calibrated on other texts."""
    import openvino as ov

    from taser.models.onnx_backend import calibration_feeds

    if str(backend) not in OPENVINO_BACKENDS:
        raise ValueError(f"no OpenVINO models for backend {backend!r}: the OpenVINO backends are {', '.join(OPENVINO_BACKENDS)}")
    if str(backend) in CONVERTED_AS:
        return prepare_models(checkpoint, CONVERTED_AS[str(backend)])
    backend, checkpoint = str(backend), Path(checkpoint)
    root = cache_root(checkpoint, backend)
    identity = weights_digest(checkpoint)
    calibration = calibration_digest() if backend in OPENVINO_INT8 else None
    why = stale_reason(root, identity, RECIPES[backend], calibration, [f"{side}.{ext}" for side in SIDES for ext in ("xml", "bin")])
    if why is None:
        log.info("%s backend: models of %s reused from %s", backend, checkpoint, root)
        return root
    if why != "absent":
        log.warning("%s backend: the cache %s was %s: converting again", backend, root, why)
    from taser.models.biencoder import BiEncoder, load_tokenizer
    from taser.models.params import parameter_report

    model = BiEncoder.load(checkpoint)
    tokenizer = load_tokenizer(checkpoint) if calibration else None
    weights = {}
    with atomic_dir(root) as tmp:
        for side in SIDES:
            converted = convert_side(model, side)
            if backend in OPENVINO_INT8:
                converted = quantize_int8(converted, calibration_feeds(tokenizer, model.config, side))
            weights[side] = matmul_weights(converted)
            ov.save_model(converted, str(tmp / f"{side}.xml"), compress_to_fp16=False)  # the default would halve every weight to fp16
        meta = {"identity": identity, "backend": backend, "recipe": RECIPES[backend][1], "checkpoint": str(checkpoint),
                "parameters": parameter_report(model), "matmul_weights": weights, **({"calibration": calibration} if calibration else {}),
                **_versions()}  # fmt: skip
        (tmp / META_FILE).write_text(json.dumps(meta, indent=2))
    log.info("%s backend: converted %s to %s", backend, checkpoint, root)
    return root


# what stands between a MatMul and its constant weights: a layout change, or (int8) the dequantisation of NNCF's
# int8 constant, Convert -> Subtract (zero point) -> Multiply (scale), whose first input leads to the weights
_WEIGHT_PATH = ("Convert", "Transpose", "Reshape", "Subtract", "Multiply")


def matmul_weight_constants(converted) -> list[tuple]:
    """(MatMul, the constant its weights come from) for each MatMul with constant weights: the constant
    is float, or int8 behind NNCF's dequantisation."""
    found = []
    for op in converted.get_ops():
        if op.get_type_name() != "MatMul":
            continue
        for port in op.inputs():
            source = port.get_source_output().get_node()
            while source.get_type_name() in _WEIGHT_PATH:
                source = source.input(0).get_source_output().get_node()
            if source.get_type_name() == "Constant":
                found.append((op, source))
    return found


def matmul_weights(converted) -> int:
    """How many weights the matrix products of an OpenVINO model read (the constant operands of its
    MatMuls, float or int8): TASER's side models hold their own side's experts only."""
    return sum(int(np.prod(constant.get_output_shape(0))) for _, constant in matmul_weight_constants(converted))


def compile_side(path: Path, backend: str, threads: int | None):
    import openvino as ov

    config = {"INFERENCE_PRECISION_HINT": INFERENCE_PRECISION[ENGINE_PRECISION[backend]], "PERFORMANCE_HINT": "LATENCY",
              "INFERENCE_NUM_THREADS": int(threads or torch.get_num_threads())}  # fmt: skip
    return ov.Core().compile_model(str(path), "CPU", config)


def check_native_bf16(backend: str) -> None:
    from taser.runtime import cpu_has_native_bf16, cpu_model

    if ENGINE_PRECISION[backend] == "bf16" and not cpu_has_native_bf16():
        raise ValueError(f"backend={backend} computes in bf16, which this CPU ({cpu_model()}) has no native instructions for "
                         f"(AVX512-BF16 or AMX): OpenVINO would run it in float32. Use backend={CONVERTED_AS[backend]}")  # fmt: skip


class OpenVinoEncoder(GraphEncoder):
    """A checkpoint's two sides compiled by OpenVINO's CPU plugin, with `BiEncoder`'s encoding surface."""

    def __init__(self, config, encoder_config, root: Path, backend: str, parameter_counts: dict, threads: int | None = None):
        check_native_bf16(backend)
        self.config, self.encoder_config, self.backend, self.root = config, encoder_config, backend, root
        self.parameter_counts = parameter_counts  # the converted model's (taser.models.params)
        self.precision = ENGINE_PRECISION[backend]
        self.compiled = {side: compile_side(root / f"{side}.xml", backend, threads) for side in SIDES}
        log.info("%s backend: OpenVINO %s, inference precision %s (stated: OpenVINO's CPU default is bf16 where the CPU has it)", backend,
                 _versions()["openvino"], self.compiled["question"].get_property("INFERENCE_PRECISION_HINT").to_string())

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, side: str) -> torch.Tensor:
        feed = {"input_ids": input_ids.cpu().numpy().astype(np.int64), "attention_mask": attention_mask.cpu().numpy().astype(np.int64)}
        return torch.from_numpy(np.array(self.compiled[side](feed)[0], dtype=np.float32))


def load_openvino_encoder(checkpoint: str | os.PathLike, backend: str) -> OpenVinoEncoder:
    """The checkpoint's cached OpenVINO models compiled for this CPU; PyTorch loads the weights only to convert."""
    from transformers import AutoConfig

    from taser.models.biencoder import read_checkpoint_config

    check_native_bf16(backend)
    config, raw = read_checkpoint_config(checkpoint)
    root = prepare_models(checkpoint, backend)
    meta = json.loads((root / META_FILE).read_text())
    return OpenVinoEncoder(config, AutoConfig.for_model(**raw), root, backend, meta["parameters"])
