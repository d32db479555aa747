"""Reading foreign weight files: safetensors, PyTorch pickles, and Hugging Face model directories.

PyTorch files are read with `torch.load(weights_only=True)`, which runs no code from the file.
DPR's and TASER's training checkpoints also pickle their Hydra settings (OmegaConf objects):
those load only with `allow_pickle=True`, which runs whatever the file holds, so pass it only
for files from a source you trust.
"""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from taser.models.convert.mapping import ConversionError

SINGLE_FILES = ("model.safetensors", "pytorch_model.bin")
SHARD_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


def local_path(name_or_path: str | os.PathLike) -> Path:
    """A local file or directory as it is; an `org/name` hub name as its downloaded snapshot."""
    path = Path(name_or_path).expanduser()
    if path.exists():
        return path
    name = str(name_or_path)
    if name.startswith((os.path.sep, ".", "~")) or name.count("/") != 1:
        raise FileNotFoundError(f"not found: {name}")
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(repo_id=name))


def read_torch_file(path: str | os.PathLike, allow_pickle: bool = False) -> Any:
    """The object a PyTorch file holds, on the CPU; only tensors and plain containers unless
    `allow_pickle` (which runs code from the file)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"not found: {path}")
    try:
        return torch.load(path, map_location="cpu", weights_only=not allow_pickle)
    except pickle.UnpicklingError as err:
        unsafe = [line.strip() for line in str(err).splitlines() if "Unsupported global" in line]
        if allow_pickle or not unsafe:
            raise ConversionError(f"{path} is not a PyTorch weights file: {str(err).splitlines()[0]}") from err
        raise ConversionError(
            f"{path} holds Python objects besides tensors (DPR's and TASER's checkpoints pickle their Hydra settings), "
            "which load only by running code from the file: if you trust its source, pass allow_pickle=true "
            f"({unsafe[0].split(' was not', 1)[0].removeprefix('WeightsUnpickler error: ')})"
        ) from err
    except (RuntimeError, EOFError, ValueError, OSError, KeyError) as err:
        raise ConversionError(f"{path} is not a PyTorch or safetensors weights file: {err!r}") from err


def read_weights_file(path: str | os.PathLike, allow_pickle: bool = False) -> dict[str, torch.Tensor]:
    """The state dict of one weights file (`.safetensors`, else a PyTorch file holding a state dict)."""
    path = Path(path)
    if path.suffix == ".safetensors":
        try:
            return load_file(str(path))
        except Exception as err:  # safetensors raises its own error types
            raise ConversionError(f"{path} is not a safetensors file: {err}") from err
    state = read_torch_file(path, allow_pickle)
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ConversionError(f"{path} does not hold a state dict (a mapping of names to tensors)")
    return dict(state)


def read_model_dir(directory: str | os.PathLike, allow_pickle: bool = False) -> tuple[dict[str, torch.Tensor], Path]:
    """The weights of a Hugging Face model directory (single file or shards) and the file read."""
    directory = Path(directory)
    for name in SINGLE_FILES:
        if (directory / name).is_file():
            return read_weights_file(directory / name, allow_pickle), directory / name
    for name in SHARD_INDEXES:
        index = directory / name
        if index.is_file():
            try:
                shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            except (ValueError, KeyError, TypeError, AttributeError) as err:
                raise ConversionError(f"{index} is not a shard index (no 'weight_map'): {err}") from err
            state = {}
            for shard in shards:
                state.update(read_weights_file(directory / shard, allow_pickle))
            return state, index
    raise ConversionError(f"{directory} holds no weights ({', '.join(SINGLE_FILES + SHARD_INDEXES)})")
