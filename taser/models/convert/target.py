"""The checkpoint an import writes: a bi-encoder built from an encoder config, filled with the
mapped tensors, and saved with its tokenizer as this library's checkpoint directory.

The encoders are plain `transformers` BERT models; foreign configs (DPR's `DPRConfig`, a base
model's `config.json`) are reduced to the fields that define a BERT encoder.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

import torch
from transformers import AutoModel, BertConfig

from taser.models.biencoder import BiEncoder
from taser.models.config import BiEncoderConfig
from taser.models.convert.mapping import ConversionError
from taser.models.convert.output import output_dir, step

log = logging.getLogger(__name__)

# what a BERT encoder is; the first group fixes what its weights compute
ARCHITECTURE_FIELDS = (
    "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
    "hidden_act", "max_position_embeddings", "type_vocab_size", "layer_norm_eps",
)  # fmt: skip
BERT_FIELDS = ARCHITECTURE_FIELDS + ("hidden_dropout_prob", "attention_probs_dropout_prob", "initializer_range", "pad_token_id")


def bert_config(fields: Mapping, where: str) -> BertConfig:
    """A BERT config from the BERT fields of `fields` (a DPRConfig's, or a BERT model's)."""
    position = fields.get("position_embedding_type", "absolute")
    if position != "absolute":
        raise ConversionError(f"{where}: position_embedding_type={position!r}; only BERT's absolute positions are supported")
    missing = [k for k in ARCHITECTURE_FIELDS if k not in fields]
    if missing:
        raise ConversionError(f"{where}: not a BERT config, it lacks {', '.join(missing)}")
    return BertConfig(**{k: fields[k] for k in BERT_FIELDS if k in fields})


def new_model(config: BiEncoderConfig, encoder_config) -> BiEncoder:
    """An untrained bi-encoder of `config`'s kind whose encoders are built from `encoder_config`."""
    encoders = [AutoModel.from_config(encoder_config) for _ in range(2 if config.kind.two_encoders else 1)]
    return BiEncoder(config, *encoders)


def tensor_shapes(model: torch.nn.Module) -> dict[str, torch.Size]:
    return {name: tensor.shape for name, tensor in model.state_dict().items()}


def is_pooler(name: str) -> bool:
    """BERT's pooler (a dense layer over [CLS] trained for next-sentence prediction): no vector
    of this library or of DPR and TASER uses it, so a file may lack it."""
    return ".pooler." in name


def fill(model: BiEncoder, state: Mapping[str, torch.Tensor]) -> None:
    """Load `state` (mapped by `mapping.gather`); pooler tensors it lacks are set to zero."""
    full, zeroed = {}, []
    for name, tensor in model.state_dict().items():
        if name in state:
            full[name] = state[name]
        else:
            if not is_pooler(name):
                raise AssertionError(f"no tensor for {name}")  # gather refuses this before
            full[name] = torch.zeros_like(tensor)
            zeroed.append(name)
    model.load_state_dict(full, strict=True)
    step("map the tensors")
    if zeroed:
        log.info("the source has no BERT pooler (unused by the vectors): %d pooler tensors set to zero", len(zeroed))


def check_tokenizer(tokenizer, encoder_config, where: str) -> None:
    if len(tokenizer) > encoder_config.vocab_size:
        raise ConversionError(
            f"{where}: the tokenizer has {len(tokenizer)} tokens but the embeddings {encoder_config.vocab_size} rows: "
            "choose the tokenizer of the model the checkpoint was trained from"
        )


def write_checkpoint(model: BiEncoder, tokenizer, output: str | os.PathLike, overwrite: bool = False) -> None:
    with output_dir(output, overwrite) as tmp:
        model.save_into(tmp, tokenizer)
    step(f"write {output}")
    log.info("wrote a '%s' checkpoint to %s", model.config.model_type, output)
