"""DPR's training checkpoint file, whose layout TASER's release shares: a torch-saved dict with
`model_dict` (the bi-encoder's state dict), `encoder_params` (the encoder settings) and training
state (`optimizer_dict`, `scheduler_dict`, `offset`, `epoch`) that a conversion leaves aside.

`encoder_params` comes in two layouts, both read:
- flat: `do_lower_case`, `pretrained_model_cfg`, `encoder_model_type`, `pretrained_file`,
  `projection_dim`, `sequence_length` (DPR's first release, and TASER's released checkpoint).
  These six keys are what the DPR code TASER runs reads back (`set_cfg_params_from_state`);
  TASER's other encoder settings come from its Hydra config, so `export_taser` writes this layout;
- nested: `{"do_lower_case", "encoder": {...}}` with the whole Hydra encoder config (DPR's
  Hydra-era training checkpoints, and the files this library's `export_taser` wrote before it
  wrote the flat layout).
The encoder was built from `pretrained_model_cfg` (a hub name such as `bert-base-uncased`), which
gives the BERT config and tokenizer that the file itself does not hold.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoTokenizer

from taser.models.convert.mapping import ConversionError
from taser.models.convert.output import step
from taser.models.convert.target import bert_config
from taser.models.convert.weights import local_path, read_torch_file
from taser.models.pretrained import resolve_pretrained
from taser.models.settings import DEFAULT_MAX_LENGTH

RELEASE_FILE = "pytorch_model.bin"  # a directory (or hub repository) holds the checkpoint under this name


@dataclass
class DprCheckpoint:
    path: Path
    model_dict: dict[str, torch.Tensor]
    encoder: dict[str, Any] = field(default_factory=dict)  # the encoder settings, when the file records them

    def base_model(self, asked: str | None) -> str:
        """The BERT model the encoders were trained from: `asked`, else the file's record."""
        name = asked or self.encoder.get("pretrained_model_cfg")
        if not name:
            raise ConversionError(
                f"{self.path} does not record the model it was trained from (encoder_params.pretrained_model_cfg): "
                "give base_model=<local path or hub name of that BERT model>, whose config and tokenizer the encoders use"
            )
        return str(name)

    def max_length(self, asked: int | None) -> int:
        return int(asked or self.encoder.get("sequence_length") or DEFAULT_MAX_LENGTH)


def _plain(mapping: Any) -> dict:
    """A mapping (a dict, or a pickled OmegaConf DictConfig) as a dict of its top-level values."""
    return {str(k): mapping[k] for k in mapping} if isinstance(mapping, Mapping) else {}


def read_dpr_checkpoint(path: str | os.PathLike, allow_pickle: bool = False) -> DprCheckpoint:
    """A DPR-layout checkpoint (a file, or a directory or hub repository holding `pytorch_model.bin`);
    a bare state dict is accepted too."""
    path = local_path(path)
    if path.is_dir():
        path = path / RELEASE_FILE
    obj = read_torch_file(path, allow_pickle)
    if isinstance(obj, Mapping) and "model_dict" in obj:
        model_dict, params = obj["model_dict"], _plain(obj.get("encoder_params") or {})
    elif isinstance(obj, Mapping) and obj and all(isinstance(v, torch.Tensor) for v in obj.values()):
        model_dict, params = obj, {}
    else:
        raise ConversionError(f"{path} is neither DPR's checkpoint (a dict with 'model_dict') nor a state dict")
    if not isinstance(model_dict, Mapping) or not all(isinstance(v, torch.Tensor) for v in model_dict.values()):
        raise ConversionError(f"{path}: its model_dict is not a mapping of names to tensors")
    encoder = _plain(params["encoder"]) if "encoder" in params else params
    step(f"read {path.name}")
    return DprCheckpoint(path, dict(model_dict), encoder)


def base_encoder(checkpoint: DprCheckpoint, base_model: str | None):
    """(encoder config, tokenizer, base model name) for the encoders of `checkpoint`."""
    name = checkpoint.base_model(base_model)
    source = resolve_pretrained(name)
    try:
        config = AutoConfig.from_pretrained(source)
        tokenizer = AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError) as err:
        raise ConversionError(f"base_model {name} (for {checkpoint.path}): its config and tokenizer could not be read: {err}") from err
    if config.model_type != "bert":
        raise ConversionError(f"base_model {name} is a '{config.model_type}' model; DPR and TASER checkpoints are imported onto BERT encoders")
    encoder_config = bert_config(config.to_dict(), f"base_model {name}")
    dropout = checkpoint.encoder.get("dropout")
    if dropout:  # DPR and TASER set both rates from encoder.dropout when it is not 0
        encoder_config.hidden_dropout_prob = encoder_config.attention_probs_dropout_prob = float(dropout)
    return encoder_config, tokenizer, name
