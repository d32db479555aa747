"""Encoding through ONNX Runtime instead of PyTorch (inference only): a checkpoint's question and
passage encoders exported once to ONNX graphs, run by ONNX Runtime with its graph optimisations,
optionally with int8 weights (dynamic quantisation).

Each side is its own graph from token ids and attention mask to the final vector (encoder, TASER's
expert for that side, pooling and normalisation): TASER's question and passage experts are fixed in
their graph, as `BiEncoder.encode(..., side)` fixes them. The graphs are cached beside the
checkpoint, in `<checkpoint>/.backends/<backend>/` (or under `~/.cache/taser/backends/` when the
checkpoint's directory cannot be written), with the identity of the weights they came from
(`backend.json`): a second run loads them at once; a cache written for other weights (the checkpoint
retrained in place, a directory copied) is refused and rebuilt.

`OnnxEncoder` has the encoding surface of `BiEncoder` (`config`, `encoder_config`,
`encode(input_ids, attention_mask, side)`), so `taser.models.encoding` runs either.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path

import numpy as np
import torch
from torch import nn

from taser.io import atomic_dir

log = logging.getLogger(__name__)

SIDES = ("question", "passage")
CACHE_DIR = ".backends"
META_FILE = "backend.json"
OPSET = 17


def onnx_available() -> bool:
    """Whether the ONNX backends can run here: onnxruntime to run, onnx to export."""
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError:
        return False
    return True


def weights_digest(checkpoint: str | os.PathLike) -> str:
    """A digest of the checkpoint's weights and config (every byte: a graph is only as right as its weights)."""
    digest = hashlib.sha256()
    for name in ("config.json", "model.safetensors"):
        with open(Path(checkpoint) / name, "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                digest.update(block)
    return digest.hexdigest()[:24]


class _Side(nn.Module):
    """One side of a bi-encoder as a module from (input_ids, attention_mask) to vectors."""

    def __init__(self, model, side: str):
        super().__init__()
        self.model, self.side = model, side

    def forward(self, input_ids, attention_mask):
        return self.model.encode(input_ids, attention_mask, self.side)


def export_side(model, side: str, path: Path) -> None:
    """`model`'s `side` encoder as an ONNX graph at `path` (batch and length dynamic), in float32, padded."""
    model = model.float().cpu().eval()
    unpad, model.unpad = model.unpad, False  # the padded path: no data-dependent shapes in the graph
    try:
        length = 16
        ids = torch.full((2, length), 1000, dtype=torch.long)
        mask = torch.ones((2, length), dtype=torch.long)
        mask[1, length // 2 :] = 0
        with torch.no_grad():
            torch.onnx.export(_Side(model, side), (ids, mask), str(path), dynamo=False, opset_version=OPSET,
                              input_names=["input_ids", "attention_mask"], output_names=["vectors"],
                              dynamic_axes={"input_ids": {0: "batch", 1: "length"}, "attention_mask": {0: "batch", 1: "length"},
                                            "vectors": {0: "batch"}})  # fmt: skip
    finally:
        model.unpad = unpad


# How each backend's graphs are made, (name, version): a cache made by another version is rebuilt.
# int8 2: unsigned weights, FFN down-projections kept in float32 (int8 1, signed weights on every
# MatMul, failed the accuracy gate). Caches written before versions were recorded count as 1.
RECIPES = {"onnx": ("float32", 1), "onnx_int8": ("int8", 2)}


def ffn_down_projections(path: Path, intermediate_size: int, hidden_size: int) -> list[str]:
    """The MatMul nodes whose weight is an FFN's down-projection ([intermediate, hidden]): the
    layers whose inputs (after GELU) have the widest range, where int8 costs the most accuracy."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    shapes = {init.name: list(init.dims) for init in graph.initializer}
    return [node.name for node in graph.node
            if node.op_type == "MatMul" and any(shapes.get(x) == [intermediate_size, hidden_size] for x in node.input)]


def quantize_int8(source: Path, target: Path, keep_float: list[str] = ()) -> None:
    """int8 weights of the MatMuls (dynamic quantisation: activations quantised per batch at run
    time), per output channel; `keep_float`: node names left in float32. Unsigned weights: with
    unsigned activations they avoid the u8 x s8 saturation of CPUs without VNNI (ONNX Runtime's
    quantisation guide), and measured closer to float32 here (median cosine 0.9949 vs 0.9935)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(str(source), str(target), weight_type=QuantType.QUInt8, per_channel=True, op_types_to_quantize=["MatMul"],
                     nodes_to_exclude=list(keep_float))


def _cache_root(checkpoint: Path, backend: str) -> Path:
    beside = checkpoint / CACHE_DIR / backend
    try:
        beside.parent.mkdir(parents=True, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=beside.parent, delete=True)
        probe.close()
        return beside
    except OSError:
        key = hashlib.sha256(str(checkpoint.resolve()).encode()).hexdigest()[:16]
        return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "taser" / "backends" / key / backend


def _versions() -> dict:
    import onnxruntime

    return {"torch": torch.__version__, "onnxruntime": onnxruntime.__version__}


def prepare_graphs(checkpoint: str | os.PathLike, backend: str) -> Path:
    """The cache directory holding `<side>.onnx` for both sides of `checkpoint` under `backend`
    ("onnx" or "onnx_int8"), exported now when missing, written for other weights, or made by
    another recipe (`RECIPES`)."""
    checkpoint = Path(checkpoint)
    root = _cache_root(checkpoint, backend)
    identity = weights_digest(checkpoint)
    recipe_name, recipe = RECIPES[backend]
    meta_path = root / META_FILE
    if meta_path.is_file():
        meta = json.loads(meta_path.read_text())
        made_by = meta.get("recipe", 1)
        # a cache without parameter counts predates them: rebuilt, so loading never needs the weights in PyTorch
        if meta.get("identity") == identity and made_by == recipe and "parameters" in meta and all((root / f"{side}.onnx").is_file() for side in SIDES):
            log.info("%s backend: graphs of %s reused from %s", backend, checkpoint, root)
            return root
        why = (f"made by {recipe_name} recipe {made_by}, this version makes {recipe}" if made_by != recipe
               else f"written for other weights (identity {meta.get('identity')}, the checkpoint's is {identity})" if meta.get("identity") != identity
               else "incomplete")
        log.warning("%s backend: the cache %s was %s: exporting again", backend, root, why)
    from taser.models.biencoder import BiEncoder
    from taser.models.params import parameter_report

    model = BiEncoder.load(checkpoint)
    enc = model.encoder_config
    with atomic_dir(root) as tmp:
        for side in SIDES:
            exported = tmp / f"{side}.onnx"
            if backend == "onnx_int8":
                plain = tmp / f"{side}.fp32.onnx"
                export_side(model, side, plain)
                quantize_int8(plain, exported, ffn_down_projections(plain, enc.intermediate_size, enc.hidden_size))
                plain.unlink()
            else:
                export_side(model, side, exported)
        meta = {"identity": identity, "backend": backend, "recipe": recipe, "checkpoint": str(checkpoint), "parameters": parameter_report(model),
                **_versions()}
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


class OnnxEncoder:
    """A checkpoint's two sides as ONNX Runtime sessions, with `BiEncoder`'s encoding surface."""

    training = False
    device = torch.device("cpu")

    def __init__(self, config, encoder_config, root: Path, backend: str, parameter_counts: dict, threads: int | None = None):
        self.config, self.encoder_config, self.backend, self.root = config, encoder_config, backend, root
        self.parameter_counts = parameter_counts  # the exported model's (taser.models.params)
        self.sessions = {side: _session(root / f"{side}.onnx", threads or torch.get_num_threads()) for side in SIDES}

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, side: str) -> torch.Tensor:
        feed = {"input_ids": input_ids.cpu().numpy().astype(np.int64), "attention_mask": attention_mask.cpu().numpy().astype(np.int64)}
        return torch.from_numpy(self.sessions[side].run(["vectors"], feed)[0])

    def eval(self) -> OnnxEncoder:
        return self

    def train(self, mode: bool = True) -> OnnxEncoder:
        return self

    def to(self, device) -> OnnxEncoder:
        if torch.device(device).type != "cpu":
            raise ValueError(f"the {self.backend} backend runs on the CPU; use backend=torch on {device}")
        return self


def load_onnx_encoder(checkpoint: str | os.PathLike, backend: str) -> OnnxEncoder:
    """The checkpoint's cached graphs in ONNX Runtime sessions; PyTorch loads the weights only to export."""
    from transformers import AutoConfig

    from taser.models.biencoder import read_checkpoint_config

    config, raw = read_checkpoint_config(checkpoint)
    root = prepare_graphs(checkpoint, backend)
    parameters = json.loads((root / META_FILE).read_text())["parameters"]
    return OnnxEncoder(config, AutoConfig.for_model(**raw), root, backend, parameters)
