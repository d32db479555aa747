"""The bi-encoder: questions and passages to vectors, for every model type.

- `dpr`: two separately parameterised encoders (question, passage);
- `shared`: one encoder for both (BERT-Siamese);
- `taser`: one encoder whose specialised blocks route questions and passages to their own
  experts (see `taser.models.taser_encoder`).

A checkpoint is a directory: `config.json` (the encoder's Hugging Face config plus a `taser`
block), `model.safetensors` and the tokenizer files.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import AutoConfig, AutoModel, AutoTokenizer

from taser.io import atomic_dir
from taser.models.attention import ATTENTION_IMPLEMENTATIONS, TASER_SDPA
from taser.models.config import BiEncoderConfig
from taser.models.pooling import pool
from taser.models.pretrained import native_pooling, resolve_pretrained

SIDES = ("question", "passage")
CHECKPOINT_FORMAT = "taser-biencoder"


def _load_encoder(source: str | AutoConfig, attn: str = TASER_SDPA) -> nn.Module:
    """`attn`: `taser_sdpa` (SDPA, with a lean kernel for CPU attention dropout; see
    `taser.models.attention`), or transformers' own `sdpa` or `eager`."""
    if attn not in ATTENTION_IMPLEMENTATIONS:
        raise ValueError(f"unknown attention implementation {attn!r}; expected one of {ATTENTION_IMPLEMENTATIONS}")
    if isinstance(source, str):
        return AutoModel.from_pretrained(source, attn_implementation=attn)
    return AutoModel.from_config(source, attn_implementation=attn)


class BiEncoder(nn.Module):
    def __init__(self, config: BiEncoderConfig, question_encoder: nn.Module, passage_encoder: nn.Module | None = None):
        super().__init__()
        if (config.model_type == "dpr") != (passage_encoder is not None):
            raise ValueError("a 'dpr' model has two encoders; 'shared' and 'taser' have one")
        self.config = config
        self.question_encoder = question_encoder
        self.passage_encoder = passage_encoder
        if config.model_type == "taser":
            from taser.models.taser_encoder import specialize_encoder

            specialize_encoder(self.question_encoder, config.taser)

    # -- construction ------------------------------------------------------------------
    @classmethod
    def from_pretrained(
        cls,
        pretrained: str,
        model_type: str = "dpr",
        pooling: str = "auto",
        normalize: bool | str = "auto",
        attention: str = TASER_SDPA,
        **config_kwargs,
    ) -> "BiEncoder":
        """Initialise every encoder from one pretrained BERT-family model (path or hub name)."""
        path = resolve_pretrained(pretrained)
        own_pooling, own_normalize = native_pooling(path)
        config = BiEncoderConfig(
            model_type=model_type,
            pretrained=pretrained,
            pooling=own_pooling if pooling == "auto" else pooling,
            normalize=own_normalize if normalize == "auto" else bool(normalize),
            **config_kwargs,
        )
        q = _load_encoder(path, attention)
        p = _load_encoder(path, attention) if model_type == "dpr" else None
        return cls(config, q, p)

    @property
    def encoder_config(self):
        return self.question_encoder.config

    def encoder_for(self, side: str) -> nn.Module:
        if side == "question":
            return self.question_encoder
        if side == "passage":
            return self.passage_encoder if self.passage_encoder is not None else self.question_encoder
        raise ValueError(f"side must be one of {SIDES}, got {side!r}")

    # -- encoding ----------------------------------------------------------------------
    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, side: str) -> torch.Tensor:
        encoder = self.encoder_for(side)
        if self.config.model_type == "taser":
            from taser.models.taser_encoder import input_type

            with input_type(encoder, side):
                hidden = encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        else:
            hidden = encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return pool(hidden, attention_mask, self.config.pooling, self.config.normalize)

    def forward(self, questions: dict | None = None, passages: dict | None = None):
        q = self.encode(questions["input_ids"], questions["attention_mask"], "question") if questions else None
        p = self.encode(passages["input_ids"], passages["attention_mask"], "passage") if passages else None
        return q, p

    def set_dropout(self, hidden: float | None = None, attention: float | None = None) -> None:
        """Override the checkpoint's dropout rates (None keeps one). They are saved with the model.

        With transformers' `sdpa`, attention dropout on CPU falls back to PyTorch's unfused fp32
        computation; the default `taser_sdpa` avoids that (see `taser.models.attention`).
        """
        encoders = [self.question_encoder] + ([self.passage_encoder] if self.passage_encoder is not None else [])
        for encoder in encoders:
            for name, module in encoder.named_modules():
                if isinstance(module, nn.Dropout):
                    rate = attention if name.endswith("self.dropout") else hidden  # attention.self.dropout
                    if rate is not None:
                        module.p = float(rate)
            if hidden is not None:
                encoder.config.hidden_dropout_prob = float(hidden)
            if attention is not None:
                encoder.config.attention_probs_dropout_prob = float(attention)

    def aux_loss(self):
        """The `AuxLoss` of the forward passes since the last call (TASER learned routing), else None."""
        if self.config.model_type != "taser":
            return None
        from taser.models.taser_encoder import collect_aux_loss

        return collect_aux_loss(self.question_encoder)

    # -- persistence -------------------------------------------------------------------
    def save(self, directory: str | os.PathLike, tokenizer=None) -> None:
        with atomic_dir(directory) as tmp:
            self.save_into(tmp, tokenizer)

    def save_into(self, directory: Path, tokenizer=None) -> None:
        """Write the checkpoint files into an existing directory (no atomicity of its own)."""
        config = self.encoder_config.to_dict()
        config["taser"] = {"format": CHECKPOINT_FORMAT, **self.config.to_dict()}
        (Path(directory) / "config.json").write_text(json.dumps(config, indent=2))
        state = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}
        save_file(state, str(Path(directory) / "model.safetensors"), metadata={"format": "pt"})
        if tokenizer is not None:
            tokenizer.save_pretrained(str(directory))

    @classmethod
    def load(cls, directory: str | os.PathLike, expected_type: str | None = None, attention: str = TASER_SDPA) -> "BiEncoder":
        directory = Path(directory)
        config, raw = read_checkpoint_config(directory)
        if expected_type is not None and config.model_type != expected_type:
            raise ValueError(f"{directory} holds a '{config.model_type}' model, but model_type '{expected_type}' was asked for")
        weights = directory / "model.safetensors"
        if not weights.is_file():
            raise FileNotFoundError(f"checkpoint {directory} has a config.json but no model.safetensors")
        enc_config = AutoConfig.for_model(**raw)
        q = _load_encoder(enc_config, attention)
        p = _load_encoder(enc_config, attention) if config.model_type == "dpr" else None
        model = cls(config, q, p)
        state = load_file(str(weights))
        missing, unexpected = model.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise ValueError(f"{directory}/model.safetensors does not match its config: missing {missing[:5]}, unexpected {unexpected[:5]}")
        return model


class NotACheckpointError(ValueError):
    """A directory with a config.json that is not a taser bi-encoder checkpoint."""


def read_checkpoint_config(directory: str | os.PathLike) -> tuple[BiEncoderConfig, dict]:
    """A checkpoint's bi-encoder config and its encoder's Hugging Face config (without loading weights)."""
    config_file = Path(directory) / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"not a checkpoint directory (no config.json): {directory}")
    raw = json.loads(config_file.read_text())
    block = raw.pop("taser", None)
    if not isinstance(block, dict) or block.pop("format", None) != CHECKPOINT_FORMAT:
        raise NotACheckpointError(f"{config_file} is not a taser bi-encoder checkpoint (no 'taser' block); to start from a plain encoder use model.pretrained")
    return BiEncoderConfig.from_dict(block), raw


def load_tokenizer(source: str | os.PathLike):
    return AutoTokenizer.from_pretrained(resolve_pretrained(str(source)))


def load_biencoder(checkpoint_or_pretrained: str, model_type: str = "dpr", **kwargs) -> BiEncoder:
    """A taser checkpoint directory if it is one, else a fresh bi-encoder from pretrained weights.

    `kwargs` go to `BiEncoder.from_pretrained`; of them, a checkpoint takes only `attention`
    (its pooling and other settings are its own).
    """
    try:
        read_checkpoint_config(checkpoint_or_pretrained)
    except (FileNotFoundError, NotACheckpointError):
        # a hub name, or a plain encoder directory (from_pretrained checks the path)
        return BiEncoder.from_pretrained(checkpoint_or_pretrained, model_type=model_type, **kwargs)
    load_kwargs = {"attention": kwargs["attention"]} if "attention" in kwargs else {}
    return BiEncoder.load(checkpoint_or_pretrained, expected_type=model_type, **load_kwargs)
