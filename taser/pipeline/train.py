"""Stage: train a bi-encoder from a model config and one or more bi-encoder JSON files."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Sequence

from taser.data.biencoder_json import BiEncoderJsonFile
from taser.models.attention import TASER_SDPA
from taser.models.biencoder import BiEncoder, load_tokenizer
from taser.training.config import TrainConfig
from taser.training.distributed import init_distributed
from taser.training.trainer import Trainer, TrainResult

log = logging.getLogger(__name__)


def build_model(model_cfg: dict) -> tuple[BiEncoder, object]:
    """A fresh bi-encoder (or one continued from `init_checkpoint`) and its tokenizer."""
    cfg = dict(model_cfg)
    init = cfg.pop("init_checkpoint", None)
    dropout = cfg.pop("dropout", None)
    attention_dropout = cfg.pop("attention_dropout", None)
    attention = cfg.pop("attention", TASER_SDPA)
    if init:
        model, tokenizer = BiEncoder.load(init, expected_type=cfg["model_type"], attention=attention), load_tokenizer(init)
    else:
        pretrained = cfg.pop("pretrained")
        model = BiEncoder.from_pretrained(
            pretrained,
            model_type=cfg.pop("model_type"),
            pooling=cfg.pop("pooling", "auto"),
            normalize=cfg.pop("normalize", "auto"),
            attention=attention,
            taser=dict(cfg.pop("taser", None) or {}),
            **cfg,
        )
        tokenizer = load_tokenizer(pretrained)
    model.set_dropout(hidden=dropout, attention=attention_dropout if attention_dropout is not None else dropout)
    return model, tokenizer


def run_training(model_cfg: dict, train_files: Sequence[str], train_cfg: dict, output_dir: str | Path, dev_file: str | None = None, on_step=None) -> TrainResult:
    dist_info = init_distributed()
    model, tokenizer = build_model(model_cfg)
    cfg = TrainConfig.from_dict(dict(train_cfg))
    sets = [BiEncoderJsonFile(f) for f in train_files]
    dev = BiEncoderJsonFile(dev_file) if dev_file else None
    log.info("training %s on %s (%s records)", model.config.model_type, list(train_files), [len(s) for s in sets])
    trainer = Trainer(model, tokenizer, sets, cfg, output_dir, dev_set=dev, dist_info=dist_info, on_step=on_step)
    return trainer.train()
