"""The statistics behind a report table: for each system, dataset and metric, the figure over
seeds (mean ± standard deviation, n), a bootstrap confidence interval over questions, and the
paired test against a baseline system, Holm-corrected across the table's comparisons.

Per question, a system's outcome is averaged over its seeds first (`taser.evaluation.seeds`);
the interval and the test are over questions (`taser.evaluation.significance`). So for a
seeded system the interval says how much the figure would move with other questions, not with
other seeds: the ± (over seeds) says that. Seedless systems (BM25, zero-shot) have only the interval.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from taser.evaluation.runs import RunResult
from taser.evaluation.seeds import Outcomes, Spread, mean_outcomes, over_seeds
from taser.evaluation.significance import DEFAULT_RESAMPLES, bootstrap_interval, holm, paired_test

log = logging.getLogger(__name__)


@dataclass
class StatsSettings:
    baseline: str | None = None  # the system every other one is tested against (None: no tests)
    alpha: float = 0.05  # a difference is marked when its Holm-adjusted p-value is below this
    resamples: int = DEFAULT_RESAMPLES  # of the randomization test and of the bootstrap
    confidence: float = 0.95  # of the bootstrap interval
    bootstrap: bool = True  # compute the intervals
    seed: int = 0  # of the resampling: a report is reproducible

    def __post_init__(self):
        if not 0 < self.alpha < 1 or not 0 < self.confidence < 1:
            raise ValueError(f"alpha and confidence must be in (0, 1), got {self.alpha} and {self.confidence}")
        if self.resamples < 1:
            raise ValueError(f"resamples must be >= 1, got {self.resamples}")


@dataclass
class Cell:
    spread: Spread  # the figure of each run (results.json), over seeds
    interval: tuple[float, float] | None = None  # bootstrap over questions of the seed-averaged outcome
    delta: float | None = None  # this system's figure minus the baseline's, from the per-question outcomes
    p: float | None = None  # the paired test against the baseline
    p_holm: float | None = None
    significant: bool = False


@dataclass
class Comparison:
    settings: StatsSettings
    cells: dict[tuple[str, str, str], Cell] = field(default_factory=dict)  # (system, dataset, metric)
    seeds: dict[str, int] = field(default_factory=dict)  # system -> runs (seeds) per dataset, the most of its datasets
    seeded: dict[str, bool] = field(default_factory=dict)  # system -> whether its runs record a training seed
    questions: dict[str, int] = field(default_factory=dict)  # dataset -> questions with per-query outcomes
    tests: int = 0  # comparisons corrected together

    @property
    def has_intervals(self) -> bool:
        return any(c.interval is not None for c in self.cells.values())


def figure(run: RunResult, metric: str) -> float | None:
    """The run's figure on a report metric ("top-20" or a BEIR metric), as in its results.json."""
    value = run.top_k.get(metric.removeprefix("top-")) if metric.startswith("top-") else run.metrics.get(metric)
    return None if value is None else float(value)


def paired_difference(mine: Outcomes, other: Outcomes, settings: StatsSettings) -> tuple[float, float]:
    """(mine's figure minus other's, the paired test's p) over the same questions; `other` is
    aligned to mine's order (ValueError when they are not the same questions)."""
    theirs = other.aligned(mine.ids)
    delta = float(np.sum(mine.weights * (mine.values - theirs)))
    return delta, paired_test(mine.values, theirs, mine.weights, settings.resamples, settings.seed)


def outcomes(runs: Sequence[RunResult], metric: str) -> Outcomes | None:
    """Per-question outcomes averaged over the runs, when every run wrote them."""
    if not runs or any(r.per_query is None for r in runs):
        return None
    return mean_outcomes([(str(r.path), r.per_query) for r in runs], metric)


def by_system_and_dataset(runs: Sequence[RunResult]) -> dict[tuple[str, str], list[RunResult]]:
    """(system, dataset) -> its runs (one per seed), in the order given."""
    groups: dict[tuple[str, str], list[RunResult]] = {}
    for run in runs:
        groups.setdefault((run.system, run.dataset), []).append(run)
    return groups


def compare(runs: Sequence[RunResult], columns: Sequence[tuple[str, str]], settings: StatsSettings | None = None,
            reuse: Comparison | None = None) -> Comparison:
    """The statistics of each (system, dataset, metric) of `columns` ((dataset, metric) pairs).
    `reuse`: a comparison of the same runs against another baseline, whose bootstrap intervals
    (which do not depend on the baseline) are taken instead of resampled again when its settings
    drew them alike."""
    settings = settings or StatsSettings()
    groups = by_system_and_dataset(runs)
    same_draws = reuse is not None and (reuse.settings.confidence, reuse.settings.resamples, reuse.settings.seed) == (
        settings.confidence, settings.resamples, settings.seed)
    systems = list(dict.fromkeys(r.system for r in runs))
    if settings.baseline is not None and settings.baseline not in systems:
        raise ValueError(f"baseline={settings.baseline!r} is none of the systems: {', '.join(map(repr, systems))}")
    out = Comparison(settings)
    for (system, _), mine in groups.items():
        out.seeds[system] = max(out.seeds.get(system, 0), len(mine))
        out.seeded[system] = out.seeded.get(system, False) or any(r.seed is not None for r in mine)
    pending: list[tuple[str, str, str]] = []
    for dataset, metric in columns:
        base_runs = groups.get((settings.baseline, dataset), []) if settings.baseline else []
        # a baseline without this metric (a retriever under a reader's EM@k column) is compared with nothing
        base = outcomes(base_runs, metric) if any(figure(r, metric) is not None for r in base_runs) else None
        for system in systems:
            mine = groups.get((system, dataset))
            values = [v for v in (figure(r, metric) for r in mine or ()) if v is not None]
            if not values:
                continue
            cell = out.cells[(system, dataset, metric)] = Cell(over_seeds(values))
            averaged = outcomes(mine, metric)
            if averaged is None:
                continue
            out.questions[dataset] = len(averaged.ids)
            if settings.bootstrap:
                drawn = reuse.cells.get((system, dataset, metric)) if same_draws else None
                cell.interval = (drawn.interval if drawn is not None and drawn.interval is not None else
                                 bootstrap_interval(averaged.values, averaged.weights, settings.confidence, settings.resamples, settings.seed))
            if base is not None and system != settings.baseline:
                try:
                    cell.delta, cell.p = paired_difference(averaged, base, settings)
                except ValueError as e:
                    raise ValueError(f"{system!r} and the baseline {settings.baseline!r} on {dataset}: {e}") from None
                pending.append((system, dataset, metric))
    adjusted = holm([out.cells[key].p for key in pending])
    for key, p in zip(pending, adjusted):
        out.cells[key].p_holm = p
        out.cells[key].significant = p < settings.alpha
    out.tests = len(pending)
    return out


def note(comparison: Comparison) -> list[str]:
    """What the table's ±, n, intervals and marks mean, and how many seeds and questions they rest on (a sentence or two each)."""
    s = comparison.settings
    seeds = sorted({n for system, n in comparison.seeds.items() if comparison.seeded.get(system)})
    parts = []
    if seeds:
        counts = "/".join(str(n) for n in seeds)
        parts.append(f"Trained systems: mean ± sample standard deviation over {counts} training seed(s) (the `seeds` column: n); "
                     "a single seed shows no ±. BM25 and untrained models have no seed.")
    questions = ", ".join(f"{d}: {n:,}" for d, n in comparison.questions.items())
    if comparison.has_intervals:
        parts.append(f"[a, b]: {s.confidence:.0%} percentile-bootstrap interval over questions ({s.resamples:,} resamples; {questions}) of "
                     "each question's outcome averaged over the system's seeds (for seedless systems the only interval; for seeded "
                     "ones it reflects the questions, the ± the seeds).")
    if s.baseline is not None:
        if comparison.tests:
            parts.append(f"†: differs from **{s.baseline}** at p < {s.alpha:g} after Holm's correction over the table's {comparison.tests} "
                         "comparison(s); paired randomization test, two-sided (scipy.stats.permutation_test, sign flips of each question's "
                         f"difference of outcomes, averaged over seeds first; {s.resamples:,} resamples, exact when 2^questions is fewer; "
                         f"{questions} questions).")
        else:
            parts.append(f"No comparison with **{s.baseline}**: the runs wrote no per-query outcomes (per_query.jsonl).")
    return parts
