"""Encoding through ONNX Runtime instead of PyTorch (inference only): a checkpoint's question and
passage encoders exported once to ONNX graphs, run by ONNX Runtime with its graph optimisations,
optionally with int8 weights: activations quantised per batch (dynamic quantisation, `onnx_int8`;
`onnx_int8_qkv` also quantises the QKV projection inside the fused attention, `QAttention`), or with
ranges calibrated once on fixed texts (static quantisation, `onnx_int8_static`).

The graphs are exported with the explicit ("eager") attention, whose padding mask is one additive
float bias made once: PyTorch's SDPA exports a boolean mask turned into a bias in every layer and a
NaN guard over every softmax output (`IsNaN` + `Where` on batch x heads x L x L: 10-15% of the
kernel time measured), and ONNX Runtime's transformer optimizer recognises the explicit pattern and
fuses each self-attention into one `Attention` kernel (and the embeddings, residual LayerNorms and
GELUs into theirs). The vectors are those of PyTorch to float rounding. The fused attention reads
the padding mask as each row's length: inputs must be right-padded (`OnnxEncoder.encode` checks).

Each side is its own graph from token ids and attention mask to the final vector (encoder, TASER's
expert for that side, pooling and normalisation): TASER's question and passage experts are fixed in
their graph, as `BiEncoder.encode(..., side)` fixes them. The graphs are cached beside the
checkpoint (`taser.models.graph_cache`), and `OnnxEncoder` has the encoding surface of `BiEncoder`.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import numpy as np
import torch

from taser.io import atomic_dir
from taser.models.backends import ONNX_BACKENDS, RECIPES, onnx_available  # noqa: F401 (onnx_available: part of this module's interface)
from taser.models.graph_cache import META_FILE, SIDES, GraphEncoder, Side, cache_root, calibration_digest, encoders, stale_reason, weights_digest

log = logging.getLogger(__name__)

OPSET = 17


def export_side(model, side: str, path: Path) -> None:
    """`model`'s `side` encoder as an ONNX graph at `path` (batch and length dynamic), in float32,
    padded, with the explicit attention (see the module's docstring)."""
    model = model.float().cpu().eval()
    unpad, attention = model.unpad, [e.config._attn_implementation for e in encoders(model)]
    try:
        model.unpad = False  # the padded path: no data-dependent shapes in the graph
        for encoder in encoders(model):
            encoder.set_attn_implementation("eager")
            if encoder.config._attn_implementation != "eager":  # transformers only warns when a model cannot switch
                raise ValueError(f"{type(encoder).__name__} cannot switch to the explicit (eager) attention the ONNX export needs")
        length = 16
        ids = torch.full((2, length), 1000, dtype=torch.long)
        mask = torch.ones((2, length), dtype=torch.long)
        mask[1, length // 2 :] = 0
        with torch.no_grad():
            torch.onnx.export(Side(model, side), (ids, mask), str(path), dynamo=False, opset_version=OPSET,
                              input_names=["input_ids", "attention_mask"], output_names=["vectors"],
                              dynamic_axes={"input_ids": {0: "batch", 1: "length"}, "attention_mask": {0: "batch", 1: "length"},
                                            "vectors": {0: "batch"}})  # fmt: skip
    finally:
        model.unpad = unpad
        for encoder, name in zip(encoders(model), attention):
            encoder.set_attn_implementation(name)


def fuse_transformer(source: Path, target: Path, encoder_config) -> dict:
    """ONNX Runtime's BERT fusions (attention, embeddings + LayerNorm, residual + LayerNorm, bias +
    GELU) of the graph at `source`, written to `target`; the count of each fused operator. A block
    the patterns do not match (TASER's specialised attention) stays as exported. For right-padded
    inputs the rewrite never changes what the graph computes (a fused attention reads each row's
    length from the mask)."""
    from onnxruntime.transformers import optimizer

    fused = optimizer.optimize_model(str(source), model_type="bert", num_heads=encoder_config.num_attention_heads,
                                     hidden_size=encoder_config.hidden_size, opt_level=0)  # fmt: skip
    fused.save_model_to_file(str(target))
    return {op: n for op, n in fused.get_fused_operator_statistics().items() if n}


def ffn_down_projections(path: Path, intermediate_size: int, hidden_size: int) -> list[str]:
    """The MatMul nodes whose weight is an FFN's down-projection ([intermediate, hidden]): the
    layers whose inputs (after GELU) have the widest range, where int8 costs the most accuracy."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    shapes = {init.name: list(init.dims) for init in graph.initializer}
    return [node.name for node in graph.node
            if node.op_type == "MatMul" and any(shapes.get(x) == [intermediate_size, hidden_size] for x in node.input)]


def quantize_int8(source: Path, target: Path, keep_float: list[str] = (), attention: bool = False) -> None:
    """int8 weights of the MatMuls (dynamic quantisation: activations quantised per batch at run
    time), per output channel; `keep_float`: node names left in float32. Unsigned weights: with
    unsigned activations they avoid the u8 x s8 saturation of CPUs without VNNI (ONNX Runtime's
    quantisation guide), and measured closer to float32 here (median cosine 0.9949 vs 0.9935).
    `attention`: the fused `Attention` kernels too, as `QAttention` (int8 QKV projection, its
    input quantised per batch; ONNX Runtime gives its weights 7 bits)."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    # the fused operators (com.microsoft domain) defeat ONNX shape inference: their outputs are float32
    quantize_dynamic(str(source), str(target), weight_type=QuantType.QUInt8, per_channel=True,
                     op_types_to_quantize=["MatMul", "Attention"] if attention else ["MatMul"],
                     nodes_to_exclude=list(keep_float), extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})  # fmt: skip


# static int8 (`onnx_int8_static`): how its graphs are written, chosen by measurement (benchmarks/peers/static_format.py;
# figures in benchmarks/peers/encode_results.md). Changing it makes other graphs: a new recipe version (RECIPES).
STATIC_FORMAT = "QOperator"
CALIBRATION_BATCH = 16


def calibration_feeds(tokenizer, config, side: str, texts=None, batch_size: int = CALIBRATION_BATCH) -> list[dict]:
    """The calibration inputs of `side`'s graph: `texts` (questions, or (title, text) passages; by
    default `taser.models.calibration_texts`) tokenised as encoding does (the checkpoint's maximum
    lengths), length-sorted, right-padded, in batches."""
    from taser.models.inputs import pad_batch, passage_ids, question_ids

    if side not in SIDES:
        raise ValueError(f"side must be one of {SIDES}, got {side!r}")
    if texts is None:
        from taser.models import calibration_texts

        texts = calibration_texts.questions() if side == "question" else calibration_texts.passages()
    texts = list(texts)
    if not texts:
        raise ValueError(f"static int8 needs calibration texts for the {side} graph: none given")
    if side == "passage" and not all(isinstance(t, (tuple, list)) and len(t) == 2 for t in texts):
        raise ValueError("the passage graph calibrates on (title, text) pairs")
    ids = (question_ids(tokenizer, texts, config.max_question_length) if side == "question"
           else passage_ids(tokenizer, [t for t, _ in texts], [x for _, x in texts], config.max_length))  # fmt: skip
    ids = sorted(ids, key=len, reverse=True)
    feeds = []
    for start in range(0, len(ids), batch_size):
        batch = pad_batch(ids[start : start + batch_size], tokenizer.pad_token_id)
        feeds.append({name: batch[name].numpy().astype(np.int64) for name in ("input_ids", "attention_mask")})
    return feeds


def quantize_int8_static(source: Path, target: Path, feeds: list[dict], keep_float: list[str] = (), quant_format: str = STATIC_FORMAT) -> None:
    """int8 weights and activations of the MatMuls with the activations' ranges calibrated once
    (MinMax over `feeds`) instead of measured per batch: static quantisation. Unsigned weights and
    activations, weights per output channel, as `quantize_int8`; `keep_float`: node names left in
    float32. `quant_format`: "QOperator" (QLinearMatMul) or "QDQ" (Quantize/Dequantize pairs that
    ONNX Runtime fuses when it loads the graph). ONNX Runtime's symbolic shape inference runs first:
    the calibration needs every MatMul input's type, which plain ONNX inference loses after the
    fused (com.microsoft) operators."""
    import onnx
    from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType, quantize_static
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    if quant_format not in ("QOperator", "QDQ"):
        raise ValueError(f"quant_format must be QOperator or QDQ, got {quant_format!r}")
    if not feeds:
        raise ValueError("static int8 needs at least one calibration batch")

    class Feeds(CalibrationDataReader):
        def __init__(self):
            self.rewind()

        def get_next(self):
            return next(self.batches, None)

        def rewind(self):
            self.batches = iter(feeds)

    inferred = target.with_name(target.stem + ".shapes.onnx")
    onnx.save(SymbolicShapeInference.infer_shapes(onnx.load(str(source)), auto_merge=True), str(inferred))
    try:
        quantize_static(str(inferred), str(target), Feeds(), quant_format=QuantFormat[quant_format], op_types_to_quantize=["MatMul"],
                        per_channel=True, activation_type=QuantType.QUInt8, weight_type=QuantType.QUInt8,
                        nodes_to_exclude=list(keep_float), calibrate_method=CalibrationMethod.MinMax,
                        calibration_providers=["CPUExecutionProvider"], extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})  # fmt: skip
    finally:
        inferred.unlink(missing_ok=True)


def _versions() -> dict:
    import onnxruntime

    return {"torch": torch.__version__, "onnxruntime": onnxruntime.__version__}


def prepare_graphs(checkpoint: str | os.PathLike, backend: str) -> Path:
    """The cache directory holding `<side>.onnx` for both sides of `checkpoint` under `backend`
    (one of `ONNX_BACKENDS`), exported now when missing, written for other weights, or made by
    another recipe (`RECIPES`) or, for static int8, calibrated on other texts."""
    if str(backend) not in ONNX_BACKENDS:
        raise ValueError(f"no ONNX graphs for backend {backend!r}: the ONNX backends are {', '.join(ONNX_BACKENDS)}")
    backend = str(backend)
    checkpoint = Path(checkpoint)
    root = cache_root(checkpoint, backend)
    identity = weights_digest(checkpoint)
    recipe = RECIPES[backend][1]
    calibration = calibration_digest() if backend == "onnx_int8_static" else None
    why = stale_reason(root, identity, RECIPES[backend], calibration, [f"{side}.onnx" for side in SIDES])
    if why is None and "fused" not in json.loads((root / META_FILE).read_text()):
        why = "incomplete"  # written before the fusions were recorded
    if why is None:
        log.info("%s backend: graphs of %s reused from %s", backend, checkpoint, root)
        return root
    if why != "absent":
        log.warning("%s backend: the cache %s was %s: exporting again", backend, root, why)
    from taser.models.biencoder import BiEncoder, load_tokenizer
    from taser.models.params import parameter_report

    model = BiEncoder.load(checkpoint)
    enc = model.encoder_config
    tokenizer = load_tokenizer(checkpoint) if calibration else None
    fusions = {}
    with atomic_dir(root) as tmp:
        for side in SIDES:
            exported, plain, fused = tmp / f"{side}.onnx", tmp / f"{side}.export.onnx", tmp / f"{side}.fused.onnx"
            export_side(model, side, plain)
            fusions[side] = fuse_transformer(plain, fused, enc)
            if fusions[side].get("Attention", 0) < enc.num_hidden_layers:
                log.warning("%s backend: %d of %d self-attentions of the %s graph fused (the others run unfused)", backend,
                            fusions[side].get("Attention", 0), enc.num_hidden_layers, side)
            plain.unlink()
            if backend == "onnx":
                fused.rename(exported)
                continue
            keep_float = ffn_down_projections(fused, enc.intermediate_size, enc.hidden_size)
            if backend == "onnx_int8_static":
                quantize_int8_static(fused, exported, calibration_feeds(tokenizer, model.config, side), keep_float)
            else:
                quantize_int8(fused, exported, keep_float, attention=backend == "onnx_int8_qkv")
            fused.unlink()
        meta = {"identity": identity, "backend": backend, "recipe": recipe, "checkpoint": str(checkpoint), "parameters": parameter_report(model),
                "fused": fusions, **({"calibration": calibration, "format": STATIC_FORMAT} if calibration else {}), **_versions()}
        (tmp / META_FILE).write_text(json.dumps(meta, indent=2))
    log.info("%s backend: exported %s to %s", backend, checkpoint, root)
    return root


def _session(path: Path, threads: int | None):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if threads:
        options.intra_op_num_threads = threads
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


class OnnxEncoder(GraphEncoder):
    """A checkpoint's two sides as ONNX Runtime sessions, with `BiEncoder`'s encoding surface."""

    def __init__(self, config, encoder_config, root: Path, backend: str, parameter_counts: dict, threads: int | None = None,
                 fused: dict | None = None):
        self.config, self.encoder_config, self.backend, self.root = config, encoder_config, backend, root
        self.parameter_counts = parameter_counts  # the exported model's (taser.models.params)
        # sides whose graph has a fused attention, which reads each row's length: they need right padding
        self.reads_lengths = {side for side, ops in (fused or {}).items() if ops.get("Attention", 0)}
        self.sessions = {side: _session(root / f"{side}.onnx", threads or torch.get_num_threads()) for side in SIDES}

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, side: str) -> torch.Tensor:
        mask = attention_mask.cpu().numpy().astype(np.int64)
        left_padded = (np.diff(mask, axis=1) > 0).any(axis=1) if side in self.reads_lengths else None
        if left_padded is not None and left_padded.any():
            row = int(np.argmax(left_padded))
            raise ValueError(f"the {self.backend} backend needs right-padded inputs (the fused attention reads each row's length); "
                             f"row {row} of the batch has a pad before a token: {mask[row].tolist()}")  # fmt: skip
        feed = {"input_ids": input_ids.cpu().numpy().astype(np.int64), "attention_mask": mask}
        return torch.from_numpy(self.sessions[side].run(["vectors"], feed)[0])


def load_onnx_encoder(checkpoint: str | os.PathLike, backend: str) -> OnnxEncoder:
    """The checkpoint's cached graphs in ONNX Runtime sessions; PyTorch loads the weights only to export."""
    from transformers import AutoConfig

    from taser.models.biencoder import read_checkpoint_config

    config, raw = read_checkpoint_config(checkpoint)
    root = prepare_graphs(checkpoint, backend)
    meta = json.loads((root / META_FILE).read_text())
    return OnnxEncoder(config, AutoConfig.for_model(**raw), root, backend, meta["parameters"], fused=meta["fused"])
