"""What the CPU engines' backends (ONNX Runtime, OpenVINO) share: a checkpoint's graphs cached beside
it, checked against the weights, recipe and calibration texts they were made from, and the encoding
surface of `BiEncoder` that their encoders present.

The cache is `<checkpoint>/.backends/<backend>/` (or under `~/.cache/taser/backends/` when the
checkpoint's directory cannot be written), with the identity of the weights the graphs came from
(`backend.json`): a second run loads them at once; a cache written for other weights (the checkpoint
retrained in place, a directory copied) is refused and rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

import torch
from torch import nn

SIDES = ("question", "passage")
CACHE_DIR = ".backends"
META_FILE = "backend.json"


def weights_digest(checkpoint: str | os.PathLike) -> str:
    """A digest of the checkpoint's weights and config (every byte: a graph is only as right as its weights)."""
    digest = hashlib.sha256()
    for name in ("config.json", "model.safetensors"):
        with open(Path(checkpoint) / name, "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                digest.update(block)
    return digest.hexdigest()[:24]


def calibration_digest() -> str:
    """A digest of the shipped calibration texts (a cache calibrated on others is rebuilt)."""
    from taser.models import calibration_texts

    return hashlib.sha256(json.dumps([calibration_texts.questions(), calibration_texts.passages()]).encode()).hexdigest()[:16]


def cache_root(checkpoint: Path, backend: str) -> Path:
    beside = checkpoint / CACHE_DIR / backend
    try:
        beside.parent.mkdir(parents=True, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=beside.parent, delete=True)
        probe.close()
        return beside
    except OSError:
        key = hashlib.sha256(str(checkpoint.resolve()).encode()).hexdigest()[:16]
        return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "taser" / "backends" / key / backend


def stale_reason(root: Path, identity: str, recipe: tuple[str, int], calibration: str | None, files: list[str]) -> str | None:
    """Why the cache at `root` cannot be used (None: it can): absent, made by another recipe version,
    for other weights, calibrated on other texts, or incomplete (a file of `files` missing, or a
    record that predates the parameter counts, so loading never needs the weights in PyTorch)."""
    meta_path = root / META_FILE
    if not meta_path.is_file():
        return "absent"
    meta = json.loads(meta_path.read_text())
    made_by = meta.get("recipe", 1)  # caches written before versions were recorded count as 1
    recipe_name, version = recipe
    if made_by != version:
        return f"made by recipe {made_by}, this version makes {recipe_name} recipe {version}"
    if meta.get("identity") != identity:
        return f"written for other weights (identity {meta.get('identity')}, the checkpoint's is {identity})"
    if meta.get("calibration") != calibration:
        return f"calibrated on other texts (digest {meta.get('calibration')}, the shipped texts' is {calibration})"
    if "parameters" not in meta or not all((root / name).is_file() for name in files):
        return "incomplete"
    return None


class Side(nn.Module):
    """One side of a bi-encoder as a module from (input_ids, attention_mask) to vectors: TASER's
    expert for that side is fixed, so a graph traced from it holds that expert only."""

    def __init__(self, model, side: str):
        super().__init__()
        self.model, self.side = model, side

    def forward(self, input_ids, attention_mask):
        return self.model.encode(input_ids, attention_mask, self.side)


def encoders(model) -> list[nn.Module]:
    return [e for e in (model.question_encoder, model.passage_encoder) if e is not None]


class GraphEncoder:
    """A checkpoint's two sides compiled by a CPU engine, with `BiEncoder`'s encoding surface
    (`config`, `encoder_config`, `encode(input_ids, attention_mask, side)`, `eval`, `train`, `to`),
    so `taser.models.encoding` runs it as it runs a `BiEncoder`."""

    training = False
    device = torch.device("cpu")
    backend = "?"

    def eval(self):
        return self

    def train(self, mode: bool = True):
        return self

    def to(self, device):
        if torch.device(device).type != "cpu":
            raise ValueError(f"the {self.backend} backend runs on the CPU; use backend=torch on {device}")
        return self
