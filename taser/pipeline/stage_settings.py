"""Settings as a stage's key sees them: canonical, so that two ways of asking for the same recipe
give one key and one build, and every difference that can change the output gives another.

- Explicit defaults equal implicit ones: the settings go through their schema (`ModelSettings`,
  `TrainConfig`) and come out whole, so `model_type: dpr` written out or left to the default is
  one model.
- What `auto` or null resolve to is keyed, not the word: the model's own pooling and
  normalisation (read as the model loader reads them), lengths, similarity, temperature, the
  precision this machine trains in.
- Settings that cannot change the trained weights are left out: where and how loudly a run
  writes, validation, loader processes, compiler caches, the safety stop on non-finite losses,
  `epochs` when `max_steps` fixes the length, and the memory-only split of the batch (gradient
  caching's chunks). The batch is keyed as the global batch, questions per optimiser step over
  every process (`batch_size` x processes x `grad_accumulation`): DPR's 16 per GPU on 8 GPUs and
  128 in one process with gradient caching are one recipe (in-batch negatives are gathered over
  the ranks, `taser.training.distributed`).
- Where the bits depend on the machine in a way a table can differ by, it is keyed: on a CPU
  the number of threads a training process computes with (a sum's order depends on it), so a
  `local_parallel` job with one thread per worker never shares a stage with a basic-launcher job
  using two.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

from taser.models.config import MODEL_KINDS
from taser.models.pretrained import SHIPPED_MODEL, native_pooling, resolve_pretrained
from taser.models.settings import DEFAULT_MAX_LENGTH, ModelSettings
from taser.training.config import TrainConfig

# TrainConfig fields that cannot change the trained weights
NOT_IN_TRAIN_KEY = ("progress", "log_every", "save_every", "resume", "tensorboard", "loader_workers", "device", "name", "eval_every",
                    "val_max_questions", "val_batch_size", "compile_cache_dir", "max_nonfinite_losses", "grad_cache_chunk")

# TrainConfig fields keyed only when not at their default (the default is the recipe every key made before them trained)
UNKEYED_DEFAULTS = {"gold_negatives": 0, "loss": "nll", "margin": 1.0, "train_questions": None}


def _plain(value):
    return json.loads(json.dumps(value, default=str))  # enums and paths as strings


def _pretrained_dropout(path: str) -> float | None:
    try:
        return float(json.loads((Path(path) / "config.json").read_text())["hidden_dropout_prob"])
    except (OSError, ValueError, KeyError, TypeError):
        return None  # a hub name not on disk: the model's own, keyed as null


def model_key(model: ModelSettings | dict) -> dict:
    """The model settings in canonical form (see the module notes)."""
    settings = ModelSettings.from_value(dict(model) if isinstance(model, dict) else model)
    key = _plain(asdict(settings))
    if not MODEL_KINDS[settings.model_type].specialised:
        del key["taser"]  # refused unless default for these kinds: nothing to key
    if settings.init_checkpoint is None:
        key["pretrained"] = settings.pretrained or SHIPPED_MODEL
        path = resolve_pretrained(key["pretrained"])
        own_pooling, own_normalize = native_pooling(path)
        key["pooling"] = key["pooling"] or own_pooling
        key["normalize"] = own_normalize if key["normalize"] is None else key["normalize"]
        key["similarity"] = key["similarity"] or "dot"
        key["max_length"] = key["max_length"] or DEFAULT_MAX_LENGTH
        key["max_question_length"] = key["max_question_length"] or DEFAULT_MAX_LENGTH
        if key["dropout"] is None:
            key["dropout"] = _pretrained_dropout(path)
    if key["attention_dropout"] is None:
        key["attention_dropout"] = key["dropout"]
    return key


def cpu_threads(processes: int) -> int:
    """Threads each training process computes with on a CPU: this process's, or torchrun's one per
    rank (it sets OMP_NUM_THREADS=1 for several ranks unless the environment sets it)."""
    import torch

    if processes == 1:
        return torch.get_num_threads()
    return int(os.environ.get("OMP_NUM_THREADS") or 1)


def train_key(train: TrainConfig | dict, model: dict, processes: int, threads: bool = True) -> dict:
    """The training settings in canonical form for a run on `processes` processes (see the module
    notes); `threads=False` leaves out this machine's CPU threads (a plan of a table, not a run)."""
    from taser.runtime import pick_device, resolve_precision

    cfg = TrainConfig.from_value(dict(train) if isinstance(train, dict) else train)
    key = {k: v for k, v in _plain(asdict(cfg)).items() if k not in NOT_IN_TRAIN_KEY}
    for name, default in UNKEYED_DEFAULTS.items():  # settings added later: at their default, the keys made before them still hold
        if key[name] == default:
            del key[name]
    if cfg.loss == "nll":
        key.pop("margin", None)
    if cfg.train_questions is None:
        del key["train_subset"]
    key["global_batch"] = cfg.batch_size * processes * cfg.grad_accumulation
    del key["batch_size"], key["grad_accumulation"]
    if cfg.max_steps is not None:
        del key["epochs"]
    if not cfg.compile:
        del key["compile_buckets"]
    key["precision"] = resolve_precision(str(cfg.precision), cfg.device)
    # a checkpoint's normalisation is its own: keyed by its path; triplet: raw scores, no temperature
    if cfg.loss == "nll" and (model.get("init_checkpoint") is None or cfg.temperature is not None):
        key["temperature"] = cfg.resolved_temperature(bool(model.get("normalize")), str(model.get("similarity") or "dot"))
    if threads and pick_device(cfg.device).type == "cpu":
        key["cpu_threads"] = cpu_threads(processes)
    return key


NOT_IN_READER_KEY = frozenset({"log_every", "save_every", "progress", "resume", "device", "eval_every", "val_passages", "val_max_questions",
                               "name", "max_nonfinite_losses"})  # the name only labels reports: one recipe under two names trains once


def reader_train_key(train: dict, threads: bool = True) -> dict:
    """A reader stage's training settings in canonical form: ReaderTrainConfig's, without those that
    leave its final weights unchanged (logging, checkpoints, resuming, the device, dev selection,
    which only writes best/), `epochs` under `max_steps`, the precision as this machine resolves
    `auto`, and on a CPU the training threads (they change the bits), as `train_key` does for a
    retriever; `threads=False`: a plan of a table, not a run."""
    from taser.reader.config import ReaderTrainConfig
    from taser.runtime import pick_device, resolve_precision

    cfg = ReaderTrainConfig(**train)
    key = {k: v for k, v in _plain(asdict(cfg)).items() if k not in NOT_IN_READER_KEY}
    if cfg.max_steps is not None:
        del key["epochs"]
    key["precision"] = resolve_precision(str(cfg.precision), cfg.device)
    if threads and pick_device(cfg.device).type == "cpu":
        key["cpu_threads"] = cpu_threads(1)
    return key
