"""The bi-encoder: questions and passages to vectors, for every model type.

- `dpr`: two separately parameterised encoders (question, passage);
- `shared`: one encoder for both (BERT-Siamese);
- `taser`: one encoder whose specialised blocks route questions and passages to their own
  experts (see `taser.models.taser_encoder`).

A checkpoint is a directory: `config.json` (the encoder's Hugging Face config plus a `taser`
block), `model.safetensors` and the tokenizer files.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from transformers import AutoConfig, AutoModel, AutoTokenizer

from taser.io import atomic_dir
from taser.models.attention import TASER_SDPA, Attention
from taser.models.checkpoint_files import load_weights, read_config_block, write_checkpoint_files
from taser.models.config import BiEncoderConfig
from taser.models.dropout import use_mask_dropout
from taser.models.pooling import pool
from taser.models.pretrained import LOAD_OPTIONS, native_pooling, resolve_pretrained
from taser.models.routers import AuxLoss
from taser.models.unpad import encoder_states

SIDES = ("question", "passage")
CHECKPOINT_FORMAT = "taser-biencoder"


@dataclass
class BiEncoderOutput:
    questions: torch.Tensor | None  # (B, d) vectors, None when no questions were given
    passages: torch.Tensor | None  # (N, d)
    aux_loss: AuxLoss | None  # the routing loss of this call (TASER learned routing), else None


def mean_aux_loss(parts: list[AuxLoss | None]) -> AuxLoss | None:
    """The mean of the passes' routing losses (each pass weighs the same), None when none has one."""
    present = [a for a in parts if a is not None]
    if not present:
        return None
    total = sum((a.total for a in present[1:]), present[0].total) / len(present)
    keys = present[0].parts
    return AuxLoss(total, {k: sum(a.parts[k] for a in present) / len(present) for k in keys})


def _load_encoder(source: str | AutoConfig, attn: str = TASER_SDPA) -> nn.Module:
    """`attn`: `taser_sdpa` (SDPA, with a lean kernel for CPU attention dropout; see
    `taser.models.attention`), or transformers' own `sdpa` or `eager`."""
    attn = Attention.parse(attn, "attention implementation").value
    # float32 master weights whatever dtype they were saved in (transformers would keep a bf16 or
    # fp16 checkpoint's dtype: AdamW's small updates then vanish in rounding); autocast decides
    # the compute precision
    if isinstance(source, str):
        return AutoModel.from_pretrained(source, attn_implementation=attn, dtype=torch.float32, **LOAD_OPTIONS)
    return AutoModel.from_config(source, attn_implementation=attn, dtype=torch.float32)


def unpad_by_default(device: torch.device) -> bool:
    """Whether `unpad=None` runs padding-free on `device`: on CPUs, where it measured 1.5-1.6x a
    training step; not on GPUs until a benchmark there says so (its unequal-length attention
    groups take a masked kernel, which rules out flash attention, and its layout is computed with
    host syncs). `unpad=True` asks for it anywhere."""
    return device.type == "cpu"


class BiEncoder(nn.Module):
    """`unpad`: run the encoders on the real tokens only (`taser.models.unpad`); None: where the
    attention implementation allows it (`taser_sdpa`) and on CPUs (`unpad_by_default`); True
    requires it. A runtime setting, not saved."""

    def __init__(self, config: BiEncoderConfig, question_encoder: nn.Module, passage_encoder: nn.Module | None = None, unpad: bool | None = None):
        super().__init__()
        self.unpad = unpad
        # runtime, not saved: the padded encoder pass through this callable (compiled training,
        # `taser.training.compiled`, sets it around its training forward only); None: plain
        self.encoder_call = None
        if config.kind.two_encoders != (passage_encoder is not None):
            raise ValueError(f"a '{config.model_type}' model has {'two encoders' if config.kind.two_encoders else 'one encoder'}")
        self.config = config
        self.question_encoder = question_encoder
        self.passage_encoder = passage_encoder
        if config.kind.specialised:
            from taser.models.taser_encoder import specialize_encoder

            specialize_encoder(self.question_encoder, config.taser)
        for encoder in (self.question_encoder, self.passage_encoder):
            if encoder is not None:
                use_mask_dropout(encoder)  # cheaper CPU dropout masks, same rates (taser.models.dropout)
            pooler = getattr(encoder, "pooler", None)
            if pooler is not None:  # kept for the checkpoint layouts, but no vector uses it: not trained
                pooler.requires_grad_(False)

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
    ) -> BiEncoder:
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
        p = _load_encoder(path, attention) if config.kind.two_encoders else None
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
    def runs_unpadded(self, encoder: nn.Module) -> bool:
        """Whether `encoder` runs padding-free under the `unpad` setting (ValueError if it cannot)."""
        if self.unpad is False:
            return False
        packs = getattr(encoder.config, "_attn_implementation", None) == TASER_SDPA
        if self.unpad is None and not unpad_by_default(next(encoder.parameters()).device):
            return False
        if self.unpad and not packs:
            raise ValueError(
                f"unpad=True needs attention={TASER_SDPA}; the encoder uses {encoder.config._attn_implementation!r} (set unpad to false or null)"
            )
        return packs

    def encode_with_routing(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, side: str) -> tuple[torch.Tensor, AuxLoss | None]:
        """Vectors of inputs of type `side`, and this pass's routing loss (TASER learned routing; else None)."""
        encoder = self.encoder_for(side)
        aux = None
        call = self.encoder_call
        unpad = False if call is not None else self.runs_unpadded(encoder)
        if self.config.kind.specialised:
            from taser.models.taser_encoder import encode

            hidden, aux = encode(encoder, input_ids, attention_mask, side, unpad, call=call)
        else:
            hidden = encoder_states(encoder, input_ids, attention_mask, unpad, call=call)
        return pool(hidden, attention_mask, self.config.pooling, self.config.normalize), aux

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, side: str) -> torch.Tensor:
        return self.encode_with_routing(input_ids, attention_mask, side)[0]

    def forward(self, questions: dict | None = None, passages: dict | None = None) -> BiEncoderOutput:
        """Question and passage vectors (either may be left out) and the routing loss of both passes."""
        q = p = None
        auxes = []
        if questions:
            q, aux = self.encode_with_routing(questions["input_ids"], questions["attention_mask"], "question")
            auxes.append(aux)
        if passages:
            p, aux = self.encode_with_routing(passages["input_ids"], passages["attention_mask"], "passage")
            auxes.append(aux)
        return BiEncoderOutput(q, p, mean_aux_loss(auxes))

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

    # -- persistence -------------------------------------------------------------------
    def save(self, directory: str | os.PathLike, tokenizer=None) -> None:
        with atomic_dir(directory) as tmp:
            self.save_into(tmp, tokenizer)

    def save_into(self, directory: Path, tokenizer=None) -> None:
        """Write the checkpoint files into an existing directory (no atomicity of its own)."""
        write_checkpoint_files(directory, self, self.encoder_config.to_dict(), "taser", CHECKPOINT_FORMAT, self.config.to_dict(), tokenizer)

    @classmethod
    def load(cls, directory: str | os.PathLike, expected_type: str | None = None, attention: str = TASER_SDPA) -> BiEncoder:
        directory = Path(directory)
        config, raw = read_checkpoint_config(directory)
        if expected_type is not None and config.model_type != expected_type:
            raise ValueError(f"{directory} holds a '{config.model_type}' model, but model_type '{expected_type}' was asked for")
        enc_config = AutoConfig.for_model(**raw)
        q = _load_encoder(enc_config, attention)
        p = _load_encoder(enc_config, attention) if config.kind.two_encoders else None
        return load_weights(cls(config, q, p), directory)


class NotACheckpointError(ValueError):
    """A directory with a config.json that is not a taser bi-encoder checkpoint."""


def read_checkpoint_config(directory: str | os.PathLike) -> tuple[BiEncoderConfig, dict]:
    """A checkpoint's bi-encoder config and its encoder's Hugging Face config (without loading weights)."""
    block, raw, config_file = read_config_block(directory, "taser", CHECKPOINT_FORMAT, "checkpoint")
    if block is None:
        raise NotACheckpointError(f"{config_file} is not a taser bi-encoder checkpoint (no 'taser' block); to start from a plain encoder use model.pretrained")
    return BiEncoderConfig.from_dict(block), raw


def load_tokenizer(source: str | os.PathLike):
    return AutoTokenizer.from_pretrained(resolve_pretrained(str(source)))
