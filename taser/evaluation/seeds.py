"""Runs of one system over several training seeds: the spread of a figure (mean, standard
deviation, n) and the per-question outcome averaged over seeds, which the significance tests
and the bootstrap take (`taser.evaluation.significance`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from taser.evaluation.per_query import metric_values, question_weights


@dataclass(frozen=True)
class Spread:
    """A figure over n runs: its mean, sample standard deviation (n - 1 in the denominator; None
    for a single run), minimum and maximum."""

    mean: float
    std: float | None
    n: int
    low: float
    high: float


def over_seeds(values: Sequence[float]) -> Spread:
    if not values:
        raise ValueError("no values to aggregate")
    v = [float(x) for x in values]
    mean = sum(v) / len(v)
    std = math.sqrt(sum((x - mean) ** 2 for x in v) / (len(v) - 1)) if len(v) > 1 else None
    return Spread(mean, std, len(v), min(v), max(v))


@dataclass(frozen=True)
class Outcomes:
    """Per question (in `ids`' order): the outcome averaged over the runs' seeds, and its weight
    in the dataset's figure."""

    ids: tuple[str, ...]
    values: np.ndarray
    weights: np.ndarray
    runs: int

    def aligned(self, ids: Sequence[str]) -> np.ndarray:
        """The values in the order of `ids`, which must be the same questions."""
        if tuple(ids) == self.ids:
            return self.values
        where = {q: i for i, q in enumerate(self.ids)}
        if set(ids) != set(where):
            missing, extra = set(ids) - set(where), set(where) - set(ids)
            raise ValueError(f"the runs were evaluated on different questions ({len(missing)} missing, {len(extra)} extra, "
                             f"e.g. {sorted(missing or extra)[:3]})")
        return self.values[[where[q] for q in ids]]


def mean_outcomes(per_run: Sequence[tuple[str, Sequence[dict]]], metric: str) -> Outcomes:
    """The per-question outcomes on `metric` of several runs (each (its name for errors, its
    per-query records)) averaged question by question; the runs must hold the same questions."""
    if not per_run:
        raise ValueError("no runs")
    first_name, first = per_run[0]
    ids = tuple(str(r["id"]) for r in first)
    base = Outcomes(ids, metric_values(first, metric), question_weights(first), 1)
    total = base.values.copy()
    for name, records in per_run[1:]:
        other = Outcomes(tuple(str(r["id"]) for r in records), metric_values(records, metric), question_weights(records), 1)
        try:
            total += other.aligned(ids)
        except ValueError as e:
            raise ValueError(f"{first_name} and {name}: {e}") from None
    return Outcomes(ids, total / len(per_run), base.weights, len(per_run))
