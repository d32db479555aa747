"""The training and validation sets a data config names, opened on every rank: DPR's JSON read in
place (`data.train_reader=json`), its Arrow copy (`arrow`, converted once), or hub datasets
(`data.source=hub`, DPR's or Tevatron's layout), both memory-mapped.

What is made once (an Arrow copy, datasets' cache of JSON data files) is made by each node's
local rank 0 while the other ranks wait; they then open what it made.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from taser.data.arrow_training import ArrowTrainingSet, ensure_arrow_copy, open_arrow_file
from taser.data.biencoder_json import BiEncoderJsonFile
from taser.data.config import DataConfig, DataSource, TrainReader
from taser.data.hub import HubSplit, load_split
from taser.training.distributed import DistInfo

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class TrainingData:
    sets: list  # each: len() and [i] -> a DPR record
    dev: object | None
    names: list[str]  # each set's, for the log


def local_main_first(dist_info: DistInfo | None, make: Callable[[], T]) -> T:
    """`make()` on this node's local rank 0, then on the other ranks (which find what it made).
    A failure there stops every rank: the others raise instead of waiting."""
    if dist_info is None or dist_info.world_size <= 1:
        return make()
    import torch
    import torch.distributed as dist

    from taser.training.distributed import preparation_group

    group = preparation_group()  # not the default group: its timeout (30 minutes) would fail the waiting ranks
    result, error = None, None
    if dist_info.local_rank == 0:
        try:
            result = make()
        except Exception as e:  # noqa: BLE001 (re-raised below, after the other ranks are told)
            error = e
    failed = torch.tensor([1 if error else 0])
    dist.all_reduce(failed, group=group)
    if error is not None:
        raise error
    if int(failed):
        raise RuntimeError("local rank 0 of a node failed to prepare the training data (its log says why)")
    return result if dist_info.local_rank == 0 else make()


def _hub_set(spec: HubSplit, data: DataConfig, dist_info: DistInfo | None, require_positive: bool) -> ArrowTrainingSet:
    dataset = local_main_first(dist_info, lambda: load_split(spec, data.hub.cache_dir))
    return ArrowTrainingSet(dataset, str(spec), require_positive)


def _file_set(path: str, data: DataConfig, dist_info: DistInfo | None, require_positive: bool = True):
    if data.train_reader == TrainReader.json:
        return BiEncoderJsonFile(path, require_positive)
    copy = local_main_first(dist_info, lambda: ensure_arrow_copy(path, data.arrow_cache_dir, require_positive))
    return open_arrow_file(copy, f"{path} (its Arrow copy {copy})", require_positive)


def open_training_data(data: DataConfig, dist_info: DistInfo | None = None) -> TrainingData:
    if data.source == DataSource.hub:
        if not data.hub.train:
            raise ValueError("no training data: set data.hub.train (data.source=hub)")
        sets = [_hub_set(spec, data, dist_info, True) for spec in data.hub.train]
        dev = _hub_set(data.hub.dev, data, dist_info, True) if data.hub.dev.name else None
        return TrainingData(sets, dev, [str(spec) for spec in data.hub.train])
    if not data.train_files:
        raise ValueError("no training files: set data.train_files")
    sets = [_file_set(path, data, dist_info) for path in data.train_files]
    dev = _file_set(data.dev_file, data, dist_info) if data.dev_file else None
    return TrainingData(sets, dev, list(data.train_files))


def files_config(train_files: Sequence[str], dev_file: str | None) -> DataConfig:
    """A data config of local JSON files read in place (the callers that name files only)."""
    return DataConfig(train_files=list(train_files), dev_file=dev_file)
