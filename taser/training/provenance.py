"""Where a checkpoint came from: the training run that wrote it, its seed and its system name.

A trained checkpoint is `<run>/final` (or the resumable `<run>/checkpoint`) beside the run's
`train_summary.json` (`taser.training.trainer`), whose `config` is the run's `train` block. An
evaluation copies `train.seed` and `train.name` from it into `results.json`, so that the report
can group the runs of one system over seeds. A checkpoint without one (a zero-shot model, an
imported release) has no seed.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

SUMMARY_FILE = "train_summary.json"


def training_summary(checkpoint: str | os.PathLike | None) -> tuple[Path, dict] | None:
    """(path, contents) of the `train_summary.json` in the checkpoint's directory or the one above it; None when neither has one."""
    if not checkpoint:
        return None
    directory = Path(checkpoint)
    for candidate in (directory / SUMMARY_FILE, directory.parent / SUMMARY_FILE):
        if candidate.is_file():
            try:
                summary = json.loads(candidate.read_text(encoding="utf-8"))
            except json.JSONDecodeError as e:
                log.warning("%s: unreadable (%s); the evaluation records no training seed", candidate, e.msg)
                return None
            return (candidate, summary) if isinstance(summary, dict) else None
    return None


def training_provenance(checkpoint: str | os.PathLike | None) -> dict:
    """{"seed": the run's train.seed or None, "train_name": its train.name when set, "train_summary": its path when found}."""
    found = training_summary(checkpoint)
    if found is None:
        return {"seed": None}
    path, summary = found
    config = summary.get("config") or {}
    out = {"seed": config.get("seed"), "train_summary": str(path)}
    if config.get("name"):
        out["train_name"] = str(config["name"])
    return out
