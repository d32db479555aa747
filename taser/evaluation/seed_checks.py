"""What the training seed alone does to a comparison, put beside the paired test over questions.

The paired test of `taser.evaluation.comparison` averages each system's outcomes over its seeds and
asks whether other questions would undo the difference; it never asks whether other seeds would.
Two checks answer that from the same runs:

- **seed against seed**: every pair of seeds of one system, tested with the same paired test
  (uncorrected). Each of these systems is one recipe, so every rejection is one a seed made: when
  seeds of one recipe often "differ significantly", a † between two recipes whose difference is
  no larger than that may be the seeds' doing, not the recipes'.
- **seed by seed**: a system's figure at seed s minus the baseline's at the same s, for each seed
  both were trained with. The trainer draws the batch order from the seed (and the negatives,
  where the rows draw them alike), so runs at one seed share some of their randomness. This is a
  check, not a test: one sign at every seed is needed before calling a recipe better, but it also
  happens by chance (probability 2 / 2**n over n seeds; no test over 3 seeds reaches p < 0.05
  without assumptions).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import combinations

from taser.evaluation.comparison import StatsSettings, by_system_and_dataset, figure, outcomes, paired_difference
from taser.evaluation.runs import RunResult


@dataclass(frozen=True)
class SeedPair:
    """Two seeds of one system on one dataset and metric: the difference of their figures (the
    first seed's minus the second's, from the per-question outcomes) and its paired test's p."""

    system: str
    dataset: str
    metric: str
    seeds: tuple[int, int]
    delta: float
    p: float


def _seeded_groups(runs: Sequence[RunResult]) -> dict[tuple[str, str], list[RunResult]]:
    """(system, dataset) -> its runs that record a training seed, in seed order."""
    groups = by_system_and_dataset([r for r in runs if r.seed is not None])
    return {key: sorted(mine, key=lambda r: r.seed) for key, mine in groups.items()}


def seed_against_seed(runs: Sequence[RunResult], columns: Sequence[tuple[str, str]], settings: StatsSettings | None = None) -> list[SeedPair]:
    """The paired test between every two seeds of each system, on each (dataset, metric) of
    `columns` that both runs have a figure for; runs without per-query outcomes are left out."""
    settings = settings or StatsSettings()
    pairs = []
    for (system, dataset), mine in _seeded_groups(runs).items():
        mine = [r for r in mine if r.per_query is not None]
        for metric in (m for d, m in columns if d == dataset):
            with_figure = [r for r in mine if figure(r, metric) is not None]  # not e.g. a reader's EM@k beside a retriever's runs
            each = [outcomes([r], metric) for r in with_figure]  # once per run, not once per pair
            for (a, first), (b, second) in combinations(zip(with_figure, each), 2):
                try:
                    delta, p = paired_difference(first, second, settings)
                except ValueError as e:
                    raise ValueError(f"{system!r} on {dataset}, seeds {a.seed} and {b.seed}: {e}") from None
                pairs.append(SeedPair(system, dataset, metric, (a.seed, b.seed), delta, p))
    return pairs


def seed_by_seed(runs: Sequence[RunResult], columns: Sequence[tuple[str, str]], baseline: str) -> dict[tuple[str, str, str], list[tuple[int, float]]]:
    """(system, dataset, metric) -> [(seed, the system's figure minus the baseline's at that seed)]
    over the seeds both have, for every system but the baseline; systems sharing no seed with it are left out."""
    groups = _seeded_groups(runs)
    out = {}
    for (system, dataset), mine in groups.items():
        base = {r.seed: r for r in groups.get((baseline, dataset), [])}
        if system == baseline or not base:
            continue
        for metric in (m for d, m in columns if d == dataset):
            diffs = []
            for run in mine:
                other = base.get(run.seed)
                mine_value, base_value = figure(run, metric), None if other is None else figure(other, metric)
                if mine_value is not None and base_value is not None:
                    diffs.append((run.seed, mine_value - base_value))
            if diffs:
                out[(system, dataset, metric)] = diffs
    return out
