"""Stage: train a bi-encoder from a model config and one or more bi-encoder JSON files."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from taser.data.biencoder_json import BiEncoderJsonFile
from taser.models.loading import check_settings, load_model
from taser.models.settings import ModelSettings
from taser.training.config import TrainConfig
from taser.training.distributed import destroy_distributed, init_distributed
from taser.training.trainer import Trainer, TrainResult

log = logging.getLogger(__name__)


def run_training(model_cfg: ModelSettings | dict, train_files: Sequence[str], train_cfg: TrainConfig | dict, output_dir: str | Path,
                 dev_file: str | None = None, on_step=None) -> TrainResult:
    """Settings are checked first (reading no weights or data), then the data opened, then the model loaded."""
    settings = ModelSettings.from_value(model_cfg)
    cfg = TrainConfig.from_value(train_cfg)
    check_settings(settings)
    if not train_files:
        raise ValueError("no training files: set data.train_files")
    dist_info = init_distributed(device=cfg.device)  # the process group follows the training device
    try:
        sets = [BiEncoderJsonFile(f) for f in train_files]
        model, tokenizer = load_model(settings)
        dev = BiEncoderJsonFile(dev_file) if dev_file else None
        log.info("training %s on %s (%s records)", model.config.model_type, list(train_files), [len(s) for s in sets])
        trainer = Trainer(model, tokenizer, sets, cfg, output_dir, dev_set=dev, dist_info=dist_info, on_step=on_step)
        return trainer.train()
    finally:
        if dist_info.started_group:
            destroy_distributed()
