"""A fixed subset of the training questions (`train.train_questions`, DPR's Figure 1): the first N
records, or N drawn once from the run's seed (`train.train_subset=seeded`), kept in file order.

The subset depends only on (N, mode, seed, the set's length), so every epoch and every resume
trains on the same questions, and a question's gold negatives (`train.gold_negatives`) come from
the subset's own positives.
"""

from __future__ import annotations

import random
from collections.abc import Sequence


class TrainingSubset(Sequence):
    """Records `indices` of `records`, as a sequence of their own."""

    def __init__(self, records: Sequence, indices: list[int]):
        self.records, self.indices = records, indices

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int):
        return self.records[self.indices[i]]


def subset_indices(size: int, count: int, mode: str, seed: int) -> list[int]:
    if mode == "first":
        return list(range(count))
    if mode == "seeded":
        return sorted(random.Random(f"subset:{seed}").sample(range(size), count))
    raise ValueError(f"unknown train.train_subset {mode!r}; expected one of first, seeded")


def fixed_subset(train_sets: list, count: int | None, mode: str, seed: int) -> list:
    """`train_sets` with the subset applied (unchanged when `count` is None)."""
    if count is None:
        return train_sets
    if len(train_sets) != 1:
        raise ValueError(f"train.train_questions={count} takes a subset of one training set, and this run has {len(train_sets)}; "
                         "shrink a multi-set with train.sampling_rates instead")
    (records,) = train_sets
    if count > len(records):
        name = getattr(records, "path", None) or getattr(records, "name", None) or "the training set"
        raise ValueError(f"train.train_questions={count}, but {name} has {len(records)} training questions")
    return [TrainingSubset(records, subset_indices(len(records), count, mode, seed))]
