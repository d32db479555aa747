"""What every script shares: logging to stderr and plain dicts from Hydra configs."""

from __future__ import annotations

import logging
import os
import sys

CONFIG_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")


def setup_logging(level: int = logging.INFO) -> None:
    logging.basicConfig(level=level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True)
    logging.getLogger("transformers").setLevel(logging.ERROR)


def plain(cfg) -> dict:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(cfg, resolve=True)


def run_dir() -> str:
    """Hydra's output directory of this job (differs per job under --multirun)."""
    from hydra.core.hydra_config import HydraConfig

    return HydraConfig.get().runtime.output_dir
