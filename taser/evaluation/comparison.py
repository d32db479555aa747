"""The statistics behind a report table: for each system, dataset and metric, the figure over
seeds (mean ± standard deviation, n, from the unrounded per-question outcomes), a bootstrap
confidence interval, and the tests against a baseline system, each family Holm-corrected across
the table's comparisons, or across several tables' (`one_family`: a study's tables against several
baselines, as one family).

Two tests, for two claims:
- **the recipe** (`taser.evaluation.recipes`), wherever a system or the baseline has several
  training seeds: the seed is a random effect, runs paired by seed where both have matching seeds,
  else unpaired (a seedless system is a fixed reference). Its Holm-adjusted p-value decides the
  mark (†), and its interval is a two-level bootstrap (seeds, then questions).
- **these runs** (`taser.evaluation.significance`), always: per question the outcome averaged over
  the seeds, then the exact sign-flip test over questions. It says whether these trained models
  differ on these questions, and decides the mark only where neither side has several seeds (BM25
  against zero-shot, single runs).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from taser.evaluation.recipes import MachineSplit, RecipeTest, against_fixed, machine_split, paired_by_seed, two_level_interval, unpaired
from taser.evaluation.runs import RunResult
from taser.evaluation.seeds import Outcomes, Spread, mean_outcomes, over_seeds
from taser.evaluation.significance import DEFAULT_RESAMPLES, bootstrap_interval, holm, sign_flip_test
from taser.progress import progress

log = logging.getLogger(__name__)


@dataclass
class StatsSettings:
    baseline: str | None = None  # the system every other one is tested against (None: no tests)
    alpha: float = 0.05  # a difference is marked when its Holm-adjusted p-value is below this
    resamples: int = DEFAULT_RESAMPLES  # of the randomization test and of the bootstrap
    confidence: float = 0.95  # of the bootstrap interval
    bootstrap: bool = True  # compute the intervals
    seed: int = 0  # of the resampling: a report is reproducible
    power: float = 0.8  # of the smallest detectable difference
    seeds_for: tuple[float, ...] = (1.0, 2.0)  # differences (in the table's units) for which the report says how many matched seeds they need

    def __post_init__(self):
        if not 0 < self.alpha < 1 or not 0 < self.confidence < 1:
            raise ValueError(f"alpha and confidence must be in (0, 1), got {self.alpha} and {self.confidence}")
        if self.resamples < 1:
            raise ValueError(f"resamples must be >= 1, got {self.resamples}")


@dataclass
class Cell:
    spread: Spread  # the figure of each run (from its per-question outcomes when written), over seeds
    interval: tuple[float, float] | None = None  # bootstrap: seeds then questions (several seeds), else questions
    delta: float | None = None  # this system's figure minus the baseline's, from the per-question outcomes
    p: float | None = None  # these runs: the exact sign-flip test over questions of the seed-averaged outcomes
    p_holm: float | None = None
    p_method: str | None = None  # "exact", or "Monte Carlo, N flips"
    runs_se: float | None = None  # standard error of delta over questions (these runs): for the detectable difference
    recipe: RecipeTest | None = None  # the recipe: seeds as a random effect (both systems with several seeds)
    recipe_holm: float | None = None
    recipe_level: float | None = None  # the level Holm's step-down compares the recipe's raw p with: alpha / (m - rank)
    runs_level: float | None = None  # the same for the test of these runs in its family
    significant: bool = False  # the recipe's adjusted p < alpha where it was tested, else these runs'

    @property
    def deciding_p(self) -> float | None:
        """The adjusted p-value the mark rests on."""
        return self.recipe_holm if self.recipe is not None else self.p_holm

    @property
    def deciding_level(self) -> float | None:
        """The level the mark's raw p-value had to meet under Holm's procedure (`holm_levels`)."""
        return self.recipe_level if self.recipe is not None else self.runs_level


@dataclass
class Comparison:
    settings: StatsSettings
    cells: dict[tuple[str, str, str], Cell] = field(default_factory=dict)  # (system, dataset, metric)
    seeds: dict[str, int] = field(default_factory=dict)  # system -> runs (seeds) per dataset, the most of its datasets
    seeded: dict[str, bool] = field(default_factory=dict)  # system -> whether its runs record a training seed
    questions: dict[str, int] = field(default_factory=dict)  # dataset -> questions with per-query outcomes
    tests: int = 0  # comparisons of these runs in this table
    recipe_tests: int = 0  # recipe comparisons in this table
    methods: set = field(default_factory=set)  # how the p-values over questions were computed
    machine_notes: list[str] = field(default_factory=list)  # recipe tests whose seeds ran on machines the other side's did not
    family: str | None = None  # what Holm's correction ran over when not this table alone (`one_family`)
    family_tests: int = 0  # the family's distinct comparisons of these runs (when `family`)
    family_recipe_tests: int = 0  # and its distinct recipe comparisons

    def family_sizes(self) -> tuple[int, int]:
        """How many tests of these runs, and of recipes, Holm's correction ran over."""
        return (self.family_tests, self.family_recipe_tests) if self.family else (self.tests, self.recipe_tests)

    @property
    def has_intervals(self) -> bool:
        return any(c.interval is not None for c in self.cells.values())


def run_outcomes(run: RunResult, metric: str) -> Outcomes | None:
    """One run's per-question outcomes on `metric`, read once per run and metric (the figures, the
    seed tables and the tests all start from them); None without per-query records or that metric."""
    if run.per_query is None:
        return None
    if metric not in run.outcomes_cache:
        try:
            run.outcomes_cache[metric] = mean_outcomes([(str(run.path), run.per_query)], metric)
        except ValueError:
            run.outcomes_cache[metric] = None
    return run.outcomes_cache[metric]


def figure(run: RunResult, metric: str) -> float | None:
    """The run's figure on a report metric ("top-20" or a BEIR metric): from its per-question
    outcomes when it wrote them (results.json rounds to 2 decimals), else from results.json."""
    value = run.top_k.get(metric.removeprefix("top-")) if metric.startswith("top-") else run.metrics.get(metric)
    if value is None:
        return None
    one = run_outcomes(run, metric)
    return float(value) if one is None else float(np.sum(one.weights * one.values))


def paired_difference(mine: Outcomes, other: Outcomes, settings: StatsSettings) -> tuple[float, float]:
    """(mine's figure minus other's, the paired test's p) over the same questions; `other` is
    aligned to mine's order (ValueError when they are not the same questions)."""
    delta, p, _ = paired_difference_how(mine, other, settings)
    return delta, p


def paired_difference_how(mine: Outcomes, other: Outcomes, settings: StatsSettings) -> tuple[float, float, str]:
    """`paired_difference` and how its p-value was computed."""
    theirs = other.aligned(mine.ids)
    delta = float(np.sum(mine.weights * (mine.values - theirs)))
    p, how = sign_flip_test(mine.values, theirs, mine.weights, settings.resamples, settings.seed)
    return delta, p, how


def runs_standard_error(mine: Outcomes, other: Outcomes) -> float:
    """The standard error over questions of the weighted mean difference (questions independent)."""
    d = mine.values - other.aligned(mine.ids)
    w = mine.weights
    q = len(d)
    mean = float(np.sum(w * d))
    return float(np.sqrt(np.sum(w**2 * (d - mean) ** 2) * q / max(q - 1, 1)))


def seed_table(runs: Sequence[RunResult], metric: str, ids: Sequence[str]) -> tuple[list, np.ndarray, np.ndarray] | None:
    """(seeds, S x Q outcomes in `ids`' order, weights) of a system's seeded runs with per-question
    outcomes; None when fewer than two runs qualify."""
    usable = [r for r in runs if r.seed is not None and r.per_query is not None and figure(r, metric) is not None]
    if len(usable) < 2 or len({r.seed for r in usable}) != len(usable):
        return None
    rows = [run_outcomes(r, metric) for r in usable]
    return [r.seed for r in usable], np.stack([o.aligned(ids) for o in rows]), rows[0].weights if tuple(rows[0].ids) == tuple(ids) else None


def fixed_table(runs: Sequence[RunResult], metric: str, ids: Sequence[str]) -> tuple[list, np.ndarray, None] | None:
    """A seedless system (BM25, an untrained model: one run, no training seed) as a 1 x Q table: a
    fixed reference with no seed variance of its own."""
    if len(runs) != 1 or runs[0].seed is not None or runs[0].per_query is None or figure(runs[0], metric) is None:
        return None
    return [None], run_outcomes(runs[0], metric).aligned(ids)[None, :], None


def recipe_test(mine: Sequence[RunResult], base: Sequence[RunResult], metric: str, ids: Sequence[str], weights,
                settings: StatsSettings) -> RecipeTest | None:
    """The seed-aware test of a recipe: against another recipe (both with two or more seeded runs;
    paired by seed where they match), or against a seedless system (a fixed reference, unpaired).
    None when the system has fewer than two seeded runs, or the baseline is a single seeded run."""
    a, b = seed_table(mine, metric, ids), seed_table(base, metric, ids)
    if (a is None) == (b is None):
        if a is None:
            return None
    else:  # one recipe against a seedless system, a fixed reference: the recipe's seeds still count
        a = a if a is not None else fixed_table(mine, metric, ids)
        b = b if b is not None else fixed_table(base, metric, ids)
        if a is None or b is None:
            return None
        if b[0] == [None]:
            test = against_fixed(a[1], b[1][0], weights)
        else:  # the recipe is the baseline's: the same test, its sign turned
            test = against_fixed(b[1], a[1][0], weights)
            test.delta, test.design, test.seeds = -test.delta, "unpaired, a seedless system against the recipe", (1, b[1].shape[0])
        test.interval = two_level_interval(a[1], b[1], weights, settings.confidence, settings.resamples, settings.seed, paired=False)
        recipe, fixed, runs, sign = (a, b, mine, 1.0) if b[0] == [None] else (b, a, base, -1.0)
        machines = machines_of(recipe[0], runs)
        if machines is not None:  # the recipe's seeds against the fixed reference, signed as the test is
            split = machine_split(recipe[1], fixed[1][0], machines, recipe[0], weights)
            test.by_machine = MachineSplit(tuple((m, sign * d, s) for m, d, s in split.deltas), split.f, split.df, split.p)
        return test
    (seeds_a, table_a, _), (seeds_b, table_b, _) = a, b
    matched = sorted(set(seeds_a) & set(seeds_b))
    if len(matched) >= 2:
        rows_a = table_a[[seeds_a.index(s) for s in matched]]
        rows_b = table_b[[seeds_b.index(s) for s in matched]]
        test = paired_by_seed(rows_a, rows_b, weights, matched)
        paired = True
        machines, theirs = machines_of(matched, mine), machines_of(matched, base)
        if machines is not None and machines == theirs:  # a seed whose two runs ran apart: `machines_unlike` says so
            test.by_machine = machine_split(rows_a, rows_b, machines, matched, weights)
    else:
        rows_a, rows_b = table_a, table_b
        test = unpaired(rows_a, rows_b, weights)
        paired = False
    test.interval = two_level_interval(rows_a, rows_b, weights, settings.confidence, settings.resamples, settings.seed, paired=paired)
    return test


def machines_of(seeds: Sequence, runs: Sequence[RunResult]) -> list[str] | None:
    """The machine each of `seeds` ran on among `runs`, when they record one and span two or more
    (None otherwise: nothing to split by)."""
    where = {r.seed: r.machine for r in runs}
    machines = [where.get(seed) for seed in seeds]
    return machines if None not in machines and len(set(machines)) >= 2 else None


def machines_unlike(mine: Sequence[RunResult], base: Sequence[RunResult]) -> str | None:
    """Why a recipe test's two sides may differ by machine as well as by recipe (None when they do
    not, or the runs record no machine): a matched seed that ran on different machines, or seeds of
    one side on a machine none of the other side's ran on. The test does not model the machine."""
    if any(r.machine is None for r in (*mine, *base)):
        return None
    a = {r.seed: r.machine for r in mine}
    b = {r.seed: r.machine for r in base}
    matched = sorted(s for s in set(a) & set(b) if s is not None)
    if len(matched) >= 2:  # the test pairs the matched seeds and uses only those (`recipe_test`)
        crossed = [s for s in matched if a[s] != b[s]]
        return f"seed(s) {', '.join(map(str, crossed))} of {mine[0].system} and {base[0].system} ran on different machines" if crossed else None
    for runs, others in ((mine, base), (base, mine)):
        elsewhere = sorted({r.machine for r in runs} - {r.machine for r in others})
        if elsewhere:
            seeds = sorted(str(r.seed) for r in runs if r.machine in elsewhere)
            return f"{runs[0].system}'s seed(s) {', '.join(seeds)} ran on {'; '.join(elsewhere)}, where none of {others[0].system}'s runs did"
    return None


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
    against = f" against {settings.baseline}" if settings.baseline else ""
    # a study's intervals and recipe tests take minutes: a bar on a terminal, a log line every 30 s elsewhere
    cells = progress(total=len(columns) * len(systems), desc=f"statistics{against}", unit="cell")
    for dataset, metric in columns:
        base_runs = groups.get((settings.baseline, dataset), []) if settings.baseline else []
        # a baseline without this metric (a retriever under a reader's EM@k column) is compared with nothing
        base = outcomes(base_runs, metric) if any(figure(r, metric) is not None for r in base_runs) else None
        for system in systems:
            cells.update(1)
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
                if drawn is not None and drawn.interval is not None:
                    cell.interval = drawn.interval
                else:
                    table = seed_table(mine, metric, averaged.ids)
                    cell.interval = (two_level_interval(table[1], None, averaged.weights, settings.confidence, settings.resamples, settings.seed)
                                     if table is not None else
                                     bootstrap_interval(averaged.values, averaged.weights, settings.confidence, settings.resamples, settings.seed))
            if base is not None and system != settings.baseline:
                try:
                    cell.delta, cell.p, cell.p_method = paired_difference_how(averaged, base, settings)
                    cell.runs_se = runs_standard_error(averaged, base)
                    cell.recipe = recipe_test(mine, base_runs, metric, averaged.ids, averaged.weights, settings)
                except ValueError as e:
                    raise ValueError(f"{system!r} and the baseline {settings.baseline!r} on {dataset}: {e}") from None
                out.methods.add(cell.p_method)
                pending.append((system, dataset, metric))
                if cell.recipe is not None:
                    unlike = machines_unlike(mine, base_runs)
                    if unlike and unlike not in out.machine_notes:
                        out.machine_notes.append(unlike)
                        log.warning("%s against %s: %s", system, settings.baseline, unlike)
    cells.close()
    adjusted = holm([out.cells[key].p for key in pending])
    for key, p in zip(pending, adjusted):
        out.cells[key].p_holm = p
    recipes = [key for key in pending if out.cells[key].recipe is not None]
    for key, p in zip(recipes, holm([out.cells[key].recipe.p for key in recipes])):
        out.cells[key].recipe_holm = p
    for key, level in zip(pending, holm_levels([out.cells[key].p for key in pending], settings.alpha)):
        out.cells[key].runs_level = level
    for key, level in zip(recipes, holm_levels([out.cells[key].recipe.p for key in recipes], settings.alpha)):
        out.cells[key].recipe_level = level
    for key in pending:
        out.cells[key].significant = out.cells[key].deciding_p < settings.alpha
    out.tests, out.recipe_tests = len(pending), len(recipes)
    return out


def holm_levels(pvalues: Sequence[float], alpha: float) -> list[float]:
    """The level each p-value had to meet under Holm's step-down procedure, in the order given. The
    i-th smallest of m is compared with alpha / (m - i + 1) while every smaller one was rejected; the
    procedure stops at the first that is not, so that one and every later one had to meet the level of
    the step where it stopped (a later comparison is never reached at its own, looser step). Tied
    p-values share the first step of their group, as Holm's adjusted p-values do, whatever their order."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    levels = [0.0] * m
    step, stopped = 0, None
    for rank, i in enumerate(order):
        if rank == 0 or pvalues[i] != pvalues[order[rank - 1]]:
            step = rank
        level = alpha / (m - step)
        if stopped is None and pvalues[i] > level:
            stopped = level
        levels[i] = level if stopped is None else stopped
    return levels


def one_family(comparisons: Sequence[Comparison], name: str) -> None:
    """Holm's correction over every test of several tables at once (`name` says what they are, e.g.
    "the study's 3 tables"), in place of each table's own: the family-wise error rate then holds for
    what a write-up argues across the tables. A test shown in two tables (A in the table against B,
    B in the table against A) is one test, counted once and adjusted alike in both; every mark is
    decided again, at the same alpha."""
    alphas = {c.settings.alpha for c in comparisons}
    if len(alphas) > 1:
        raise ValueError(f"one family needs one alpha, got {sorted(alphas)}")
    alpha = alphas.pop() if alphas else StatsSettings().alpha

    def distinct(p_of) -> list[list[Cell]]:
        found: dict[tuple, list[Cell]] = {}
        for comparison in comparisons:
            for (system, dataset, metric), cell in comparison.cells.items():
                if p_of(cell) is not None:
                    found.setdefault((frozenset((system, comparison.settings.baseline)), dataset, metric), []).append(cell)
        for key, cells in found.items():
            if len({round(p_of(c), 12) for c in cells}) > 1:
                log.warning("%s on %s %s: the two tables' p-values differ (%s); the first is used", " and ".join(sorted(key[0])),
                            key[1], key[2], ", ".join(f"{p_of(c):.3g}" for c in cells))
        return list(found.values())

    runs = distinct(lambda cell: cell.p if cell.p_holm is not None else None)
    raw = [cells[0].p for cells in runs]
    for cells, adjusted, level in zip(runs, holm(raw), holm_levels(raw, alpha)):
        for cell in cells:
            cell.p_holm, cell.runs_level = adjusted, level
    recipes = distinct(lambda cell: cell.recipe.p if cell.recipe is not None else None)
    raw = [cells[0].recipe.p for cells in recipes]
    for cells, adjusted, level in zip(recipes, holm(raw), holm_levels(raw, alpha)):
        for cell in cells:
            cell.recipe_holm, cell.recipe_level = adjusted, level
    for comparison in comparisons:
        for cell in comparison.cells.values():
            if cell.p_holm is not None:
                cell.significant = cell.deciding_p < alpha
        comparison.family, comparison.family_tests, comparison.family_recipe_tests = name, len(runs), len(recipes)


def _family_words(comparison: Comparison, recipes: bool) -> str:
    tests, recipe_tests = comparison.family_sizes()
    if comparison.family:
        count = f"{recipe_tests} distinct recipe comparison(s)" if recipes else f"{tests} distinct comparison(s)"
        return f"over the {count} of {comparison.family} (the family; a comparison shown in two tables counted once)"
    return (f"over the table's {recipe_tests} recipe comparison(s) (the family: this table, not the study)" if recipes
            else f"over the table's {tests} comparison(s) (the family: this table)")


def note(comparison: Comparison) -> list[str]:
    """What the table's ±, n, intervals and marks mean, which test each mark rests on, its family,
    and how many seeds and questions they rest on (a sentence or two each)."""
    s = comparison.settings
    seeds = sorted({n for system, n in comparison.seeds.items() if comparison.seeded.get(system)})
    parts = []
    if seeds:
        counts = "/".join(str(n) for n in seeds)
        parts.append(f"Trained systems: mean ± sample standard deviation over {counts} training seed(s) (the `seeds` column: n), computed "
                     "from each run's unrounded per-question outcomes; a single seed shows no ±. BM25 and untrained models have no seed.")
    questions = ", ".join(f"{d}: {n:,}" for d, n in comparison.questions.items())
    if comparison.has_intervals:
        parts.append(f"[a, b]: {s.confidence:.0%} percentile-bootstrap interval ({s.resamples:,} resamples; {questions} questions): for a "
                     "system with several seeds, seeds drawn with replacement, then questions (how far the recipe's figure could move with "
                     "other seeds and other questions); for a seedless or single-seed system, questions only.")
    if s.baseline is not None:
        if comparison.tests:
            how = ", ".join(sorted(comparison.methods)) or "exact"
            if comparison.recipe_tests:
                parts.append(f"†: the **recipe** differs from **{s.baseline}** at p < {s.alpha:g}, wherever a trained recipe with several "
                             "seeds is involved: a crossed question x seed model of the per-question differences (variance components by the "
                             "method of moments, none below 0), runs paired by seed where "
                             "both have matching seeds, else unpaired (a seedless system, BM25 or zero-shot, is a fixed reference), "
                             f"Student's t with Satterthwaite's df, two-sided, after Holm's correction {_family_words(comparison, True)}.")
            lead = ("Where neither side has several seeds, † rests on" if comparison.recipe_tests
                    else f"†: differs from **{s.baseline}** at p < {s.alpha:g} by")
            parts.append(f"{lead} "
                         "the test of **these runs**: per question the outcome averaged over the seeds, the paired sign-flip test over "
                         f"questions ({how} p-values; {questions} questions), two-sided, after Holm's correction {_family_words(comparison, False)}. "
                         "It speaks of these trained models on these questions, "
                         "not of their recipes.")
        else:
            parts.append(f"No comparison with **{s.baseline}**: the runs wrote no per-query outcomes (per_query.jsonl).")
    if comparison.machine_notes:
        parts.append("**Machines differ** (the recipe test does not model the machine, so these differences are also differences "
                     "of machine): " + "; ".join(comparison.machine_notes) + ".")
    if any(c.recipe is not None and c.recipe.by_machine for c in comparison.cells.values()):
        parts.append("Some recipe tests rest on seeds that ran on different machines (each seed's two runs on one): their difference "
                     "machine by machine, and the test of whether it changes with the machine, are in the table \"machine by machine\".")
    return parts
