"""DPR's extractive reader around any BERT-family encoder (`transformers.AutoModel`).

Each input is `[CLS] question [SEP] title [SEP] passage` (token types all 0, as DPR's reader
feeds them). Over the encoder's last hidden states, `qa_outputs` (Linear(hidden, 2)) gives every
token a start and an end logit, and `qa_classifier` (Linear(hidden, 1)) gives each passage a
selection logit from its `[CLS]` state. The parameter names (`encoder.*`, `qa_outputs.*`,
`qa_classifier.*`) are those of DPR's `Reader`, so its checkpoints map one to one.

A reader checkpoint is a directory: the encoder's `config.json` with a `taser_reader` block
(format, lengths), `model.safetensors`, and the tokenizer files.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn
from transformers import AutoConfig, AutoModel, AutoTokenizer

from taser.io import atomic_dir
from taser.models.checkpoint_files import load_weights, read_config_block, write_checkpoint_files
from taser.models.pretrained import LOAD_OPTIONS, resolve_pretrained

READER_FORMAT = "taser-reader-1"
CONFIG_KEY = "taser_reader"


@dataclass
class ReaderConfig:
    max_length: int = 256
    max_question_length: int = 64
    pretrained: str | None = None  # where the encoder came from (a record only)
    max_answer_length: int = 10  # subword tokens of an answer span when reading (DPR: 10; older checkpoints: 10)

    @classmethod
    def from_dict(cls, values: dict) -> ReaderConfig:
        return cls(**{k: values[k] for k in ("max_length", "max_question_length", "pretrained", "max_answer_length") if k in values})


@dataclass
class ReaderOutput:
    start_logits: torch.Tensor  # [N, M, L]
    end_logits: torch.Tensor  # [N, M, L]
    relevance_logits: torch.Tensor  # [N, M]


def _init_linear(layer: nn.Linear, std: float) -> None:
    """DPR's `init_weights`: normal(0, 0.02) weights, zero biases."""
    layer.weight.data.normal_(mean=0.0, std=std)
    layer.bias.data.zero_()


@contextlib.contextmanager
def _quiet_transformers():
    """transformers lists the pooler weights it leaves out as unexpected: expected here."""
    logger = logging.getLogger("transformers")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _encoder(source, **kwargs) -> nn.Module:
    """The encoder of a config (`source`) or a model directory, without its pooler (no logit uses
    it), in float32 whatever dtype it was saved in: transformers keeps a bf16 or fp16 checkpoint's
    dtype, and AdamW's small updates to such weights vanish in rounding (autocast decides the
    precision of the computation)."""
    make = AutoModel.from_pretrained if isinstance(source, str) else AutoModel.from_config
    kwargs.setdefault("dtype", torch.float32)
    if isinstance(source, str):
        kwargs = {**LOAD_OPTIONS, **kwargs}
    with _quiet_transformers():
        try:
            return make(source, add_pooling_layer=False, **kwargs)
        except TypeError:  # an encoder without a pooler argument
            return make(source, **kwargs)


class Reader(nn.Module):
    def __init__(self, encoder: nn.Module, config: ReaderConfig | None = None):
        super().__init__()
        self.encoder = encoder
        self.config = config or ReaderConfig()
        hidden = encoder.config.hidden_size
        self.qa_outputs = nn.Linear(hidden, 2)
        self.qa_classifier = nn.Linear(hidden, 1)
        std = getattr(encoder.config, "initializer_range", 0.02)
        _init_linear(self.qa_outputs, std)
        _init_linear(self.qa_classifier, std)

    # -- construction -------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, source: str, max_length: int = 256, max_question_length: int = 64, max_answer_length: int = 10) -> Reader:
        """A fresh reader on the encoder at `source` (a local directory, hub name or the shipped MiniLM)."""
        return cls(_encoder(resolve_pretrained(source)), ReaderConfig(max_length, max_question_length, source, max_answer_length))

    @classmethod
    def from_encoder_config(cls, encoder_config, config: ReaderConfig) -> Reader:
        """An untrained reader whose encoder is built from `encoder_config` (imports fill it)."""
        return cls(_encoder(encoder_config), config)

    @property
    def encoder_config(self):
        return self.encoder.config

    def set_dropout(self, rate: float | None) -> None:
        """Set every dropout of the encoder to `rate` (None: leave them)."""
        if rate is None:
            return
        for module in self.encoder.modules():
            if isinstance(module, nn.Dropout):
                module.p = float(rate)
        self.encoder.config.hidden_dropout_prob = self.encoder.config.attention_probs_dropout_prob = float(rate)

    # -- the forward pass ---------------------------------------------------------------
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> ReaderOutput:
        """`input_ids`, `attention_mask`: [N questions, M passages, L tokens]."""
        n, m, length = input_ids.shape
        ids, mask = input_ids.view(n * m, length), attention_mask.view(n * m, length)
        hidden = self.encoder(input_ids=ids, attention_mask=mask, token_type_ids=torch.zeros_like(ids)).last_hidden_state
        start, end = self.qa_outputs(hidden).split(1, dim=-1)
        relevance = self.qa_classifier(hidden[:, 0, :])
        return ReaderOutput(start.squeeze(-1).view(n, m, length), end.squeeze(-1).view(n, m, length), relevance.view(n, m))

    # -- persistence --------------------------------------------------------------------
    def save(self, directory: str | os.PathLike, tokenizer=None) -> None:
        with atomic_dir(directory) as tmp:
            self.save_into(tmp, tokenizer)

    def save_into(self, directory: Path, tokenizer=None) -> None:
        """Write the checkpoint files into an existing directory (no atomicity of its own)."""
        write_checkpoint_files(directory, self, self.encoder_config.to_dict(), CONFIG_KEY, READER_FORMAT, asdict(self.config), tokenizer)

    @classmethod
    def load(cls, directory: str | os.PathLike) -> Reader:
        directory = Path(directory)
        config, raw = read_reader_config(directory)
        return load_weights(cls.from_encoder_config(AutoConfig.for_model(**raw), config), directory)


class NotAReaderError(ValueError):
    """A directory with a config.json that is not a reader checkpoint."""


def read_reader_config(directory: str | os.PathLike) -> tuple[ReaderConfig, dict]:
    """A reader checkpoint's settings and its encoder's Hugging Face config (no weights read)."""
    block, raw, config_file = read_config_block(directory, CONFIG_KEY, READER_FORMAT, "reader checkpoint")
    if block is None:
        hint = " (it is a retriever checkpoint)" if "taser" in raw else ""
        raise NotAReaderError(f"{config_file} is not a reader checkpoint (no '{CONFIG_KEY}' block){hint}; train one with "
                              "taser-train-reader or import DPR's with taser.reader.convert.import_dpr_reader")
    return ReaderConfig.from_dict(block), raw


def load_reader(directory: str | os.PathLike):
    """(reader, tokenizer) of a reader checkpoint directory."""
    return Reader.load(directory), AutoTokenizer.from_pretrained(str(directory))
