"""Stage: train a bi-encoder from a model config and its training data: bi-encoder JSON files, or
a data config (`taser.data.config.DataConfig`: JSON files read in place or through their Arrow
copies, or hub datasets)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from taser.data.config import DataConfig
from taser.models.loading import check_settings, load_model
from taser.models.settings import ModelSettings
from taser.pipeline.training_data import files_config, open_training_data
from taser.training.config import TrainConfig
from taser.training.distributed import destroy_distributed, init_distributed
from taser.training.trainer import Trainer, TrainResult

log = logging.getLogger(__name__)


def run_training(model_cfg: ModelSettings | dict, train_files: Sequence[str] | DataConfig, train_cfg: TrainConfig | dict, output_dir: str | Path,
                 dev_file: str | None = None, on_step=None) -> TrainResult:
    """Settings are checked first (reading no weights or data), then the data opened, then the model loaded.

    `train_files`: bi-encoder JSON files (with `dev_file`), or a data config (its own dev set)."""
    settings = ModelSettings.from_value(model_cfg)
    cfg = TrainConfig.from_value(train_cfg)
    check_settings(settings)
    data = train_files if isinstance(train_files, DataConfig) else files_config(train_files, dev_file)
    if not (data.hub.train if data.source == "hub" else data.train_files):
        raise ValueError("no training data: set data.hub.train" if data.source == "hub" else "no training files: set data.train_files")
    dist_info = init_distributed(device=cfg.device)  # the process group follows the training device
    try:
        opened = open_training_data(data, dist_info)
        model, tokenizer = load_model(settings)
        log.info("training %s on %s (%s records)", model.config.model_type, opened.names, [len(s) for s in opened.sets])
        trainer = Trainer(model, tokenizer, opened.sets, cfg, output_dir, dev_set=opened.dev, dist_info=dist_info, on_step=on_step)
        return trainer.train()
    finally:
        if dist_info.started_group:
            destroy_distributed()
