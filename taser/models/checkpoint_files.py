"""The files of a checkpoint directory that any of this project's models writes: a `config.json`
holding the encoder's Hugging Face config plus one block of the model's own settings, and
`model.safetensors`."""

from __future__ import annotations

import json
import os
from pathlib import Path

from safetensors.torch import load_file, save_file
from torch import nn


def read_config_block(directory: str | os.PathLike, key: str, fmt: str, what: str) -> tuple[dict | None, dict, Path]:
    """(the `key` block without its `format`, or None when absent or of another format; the rest of
    config.json, the encoder's config; the file's path). A missing config.json is an error
    naming `what` was expected."""
    config_file = Path(directory) / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"not a {what} directory (no config.json): {directory}")
    raw = json.loads(config_file.read_text())
    block = raw.pop(key, None)
    if not isinstance(block, dict) or block.pop("format", None) != fmt:
        return None, raw, config_file
    return block, raw, config_file


def load_weights(model: nn.Module, directory: str | os.PathLike) -> nn.Module:
    """`model` with the directory's `model.safetensors`, which must hold exactly its tensors."""
    weights = Path(directory) / "model.safetensors"
    if not weights.is_file():
        raise FileNotFoundError(f"{directory} has a config.json but no model.safetensors")
    missing, unexpected = model.load_state_dict(load_file(str(weights)), strict=False)
    if missing or unexpected:
        raise ValueError(f"{weights} does not match its config: missing {missing[:5]}, unexpected {unexpected[:5]}")
    return model


def write_checkpoint_files(directory: str | os.PathLike, model: nn.Module, encoder_config: dict, key: str, fmt: str, block: dict,
                           tokenizer=None) -> None:
    """config.json (the encoder's config plus `key`: `block` with its `format`), model.safetensors
    and the tokenizer's files, into an existing directory (no atomicity of its own)."""
    directory = Path(directory)
    (directory / "config.json").write_text(json.dumps({**encoder_config, key: {"format": fmt, **block}}, indent=2))
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
    if tokenizer is not None:
        tokenizer.save_pretrained(str(directory))
