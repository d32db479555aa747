"""The report's tables of differences against a baseline: the paired differences with their
p-values, the smallest difference the table can see, each system seed by seed, every two seeds of
one system, and each row beside its paper's figures (`taser.evaluation.report` assembles them)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from taser.evaluation.comparison import Comparison, StatsSettings
from taser.evaluation.runs import BEIR_METRICS, RunResult, check_beir_metrics
from taser.evaluation.seed_checks import SeedPair, seed_against_seed, seed_by_seed
from taser.evaluation.table_format import SIGNIFICANT, _columns, _in_order, _number, _signed


def _tested_delta(cell, metric: str) -> str:
    """The Δ the recipe test tested (over the matched seeds, paired by seed), and beside it the
    difference of the two systems' means over all their seeds where that is another figure."""
    tested = _signed(cell.recipe.delta, metric)
    if abs(cell.recipe.delta - cell.delta) <= 1e-9 * max(1.0, abs(cell.delta)):
        return tested
    return f"{tested} (seeds {', '.join(map(str, cell.recipe.seeds))}; all seeds: {_signed(cell.delta, metric)})"


def differences_table(runs: Sequence[RunResult], comparison: Comparison, ks: Sequence[int | str] = (20, 100),
                      beir_metrics: Sequence[str] = ("nDCG@10",)) -> str:
    """Each system's difference from the baseline with its Holm-adjusted p-values: the recipe's
    (`recipe p`, seeds as a random effect) where one has several seeds, and these runs' (`runs p`). The
    Δ shown is the one the mark's test tested: the recipe test's (over the matched seeds where paired
    by seed, with the all-seed difference beside it where that differs), else these runs'."""
    if not comparison.tests:
        return ""
    columns = [c for c in _columns(runs, ks, beir_metrics) if any(k[1:] == c[:2] and v.p is not None for k, v in comparison.cells.items())]
    head = ["system", *(f"Δ {c[2]}" for c in columns)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for system in _in_order(r.system for r in runs):
        cells = []
        for dataset, metric, _ in columns:
            cell = comparison.cells.get((system, dataset, metric))
            if cell is None or cell.p_holm is None:
                cells.append("–")
            elif cell.recipe is not None:
                cells.append(f"{_tested_delta(cell, metric)} (recipe p={cell.recipe_holm:.2g}; runs p={cell.p_holm:.2g})"
                             + (f" {SIGNIFICANT}" if cell.significant else ""))
            else:
                cells.append(f"{_signed(cell.delta, metric)} (p={cell.p_holm:.2g})" + (f" {SIGNIFICANT}" if cell.significant else ""))
        if system != comparison.settings.baseline:
            lines.append("| " + " | ".join([system, *cells]) + " |")
    return "\n".join(lines) + "\n"


def seeds_needed_cell(components, target: float, metric: str, alpha: float, power: float) -> tuple[tuple[float, float], str]:
    """The matched seeds a recipe test needs for `target` as a sort key and a cell: the count; "> 200"
    when the search's 200 seeds fall short; "none (floor X)" when no number of seeds reaches it on these
    questions (`detectable_at_any_seeds`, rounded up: more questions would, more seeds do not)."""
    from taser.evaluation.recipes import detectable_at_any_seeds, seeds_needed

    count = seeds_needed(components, target, alpha, power)
    if count is not None:
        return (count, 0.0), str(count)
    floor = detectable_at_any_seeds(components, alpha, power)
    if floor > abs(target):
        scale = 1000 if metric in BEIR_METRICS else 10  # the floor rounded up at the cell's decimals: never printed as the target itself
        return (float("inf"), floor), f"none (floor {_number(math.ceil(floor * scale) / scale, metric)})"
    return (10.0**9, floor), "> 200"


OWN_RECIPE = ("paired by seed", "unpaired, against a seedless system", "unpaired")  # the row's recipe is the one with seeds


def detectable_table(runs: Sequence[RunResult], comparison: Comparison, ks: Sequence[int | str] = (20, 100),
                     beir_metrics: Sequence[str] = ("nDCG@10",)) -> str:
    """Per column: the smallest difference detectable at `power` (alpha as the table's, before Holm)
    by the recipe test (median over the systems tested, at their seeds: paired by seed, or against a
    seedless baseline) and by the test of these runs; and the matched seeds a recipe test would need
    for the table's targets (at the observed variance). Then, per system, the same at the level its
    mark is decided at (`holm_detectable_table`)."""
    alpha, power, targets = comparison.settings.alpha, comparison.settings.power, tuple(comparison.settings.seeds_for)
    lines = []
    for dataset, metric, label in _columns(runs, ks, beir_metrics):
        cells = [c for k, c in comparison.cells.items() if k[1:] == (dataset, metric) and c.p is not None]
        tested = [c.recipe for c in cells if c.recipe is not None]
        recipes = [r for r in tested if r.design in OWN_RECIPE] or tested  # a seedless row against a recipe: only where nothing else is
        runs_mdd = [_runs_detectable(c, alpha, power) for c in cells]
        runs_mdd = [m for m in runs_mdd if m is not None]
        if not recipes and not runs_mdd:
            continue
        recipe_mdd = sorted(r.detectable(alpha, power) for r in recipes)
        seeds = sorted({r.seed_count for r in recipes})
        median = recipe_mdd[len(recipe_mdd) // 2] if recipe_mdd else None
        with_components = [r for r in recipes if r.components is not None]
        need = {}
        for target in targets:
            if metric in BEIR_METRICS or not with_components:  # the targets are points of a percentage; BEIR's metrics are fractions
                need[target] = "–"
                continue
            counts = sorted(seeds_needed_cell(r.components, target, metric, alpha, power) for r in with_components)
            need[target] = counts[len(counts) // 2][1]  # the median, a system that no number of seeds reaches counting as most
        lines.append(f"| {label} | {_number(median, metric) if median is not None else '–'}"
                     f"{f' ({min(seeds)} seeds)' if seeds else ''} | "
                     f"{_number(sorted(runs_mdd)[len(runs_mdd) // 2], metric) if runs_mdd else '–'} | "
                     + " | ".join(need[t] for t in targets) + " |")
    if not lines:
        return ""
    seeds_heads = " | ".join(f"matched seeds for a recipe difference of {t:g}" for t in targets)
    text = ("| column | recipe test (median over systems) | these runs, over questions | " + seeds_heads + " |\n"
            + "|---" * (3 + len(targets)) + "|\n" + "\n".join(lines) + "\n\n"
            f"The difference each test detects with probability {power:.0%} at p < {alpha:g} (two-sided, before Holm's correction): "
            "a 'no difference' in this table means no difference larger than about this. Recipe test: (t_{1-α/2} + t_{power}) x its standard "
            "error, at the seeds and questions here (against a seedless system, the recipe's seeds); seeds needed: the fewest matched seeds "
            "whose design reaches that difference at the observed variance components (median over the systems tested); 'none (floor X)': "
            "no number of seeds reaches it on these questions, where even unbounded seeds detect only X (the questions on which the two "
            "systems differ set it: more questions lower it, more seeds do not). These runs: the "
            "same over questions alone, which says nothing of other seeds.\n")
    at_holm = holm_detectable_table(runs, comparison, ks, beir_metrics)
    return text + ("\n" + at_holm if at_holm else "")


def holm_detectable_table(runs: Sequence[RunResult], comparison: Comparison, ks: Sequence[int | str] = (20, 100),
                          beir_metrics: Sequence[str] = ("nDCG@10",)) -> str:
    """Per system and column: the smallest difference its mark's test detects at `power` at the level
    Holm's step-down compares that test's p with (alpha / (m - rank + 1), the level the mark is decided
    at), and the matched seeds the table's targets need at that level ("" when nothing was tested)."""
    power, targets = comparison.settings.power, tuple(comparison.settings.seeds_for)
    columns = _columns(runs, ks, beir_metrics)
    rows = []
    for system in _in_order(r.system for r in runs):
        cells = []
        for dataset, metric, _ in columns:
            cell = comparison.cells.get((system, dataset, metric))
            level = None if cell is None else cell.deciding_level
            if level is None:
                cells.append("–")
            elif cell.recipe is not None:
                text = f"{_number(cell.recipe.detectable(level, power), metric)} at α {level:.2g}"
                if cell.recipe.components is not None and metric not in BEIR_METRICS and targets:
                    need = [seeds_needed_cell(cell.recipe.components, t, metric, level, power)[1] for t in targets]
                    text += "; seeds for " + "/".join(f"{t:g}" for t in targets) + ": " + "/".join(need)
                cells.append(text)
            else:
                mdd = _runs_detectable(cell, level, power)
                cells.append("–" if mdd is None else f"{_number(mdd, metric)} at α {level:.2g} (these runs)")
        if any(c != "–" for c in cells):
            rows.append("| " + " | ".join([system, *cells]) + " |")
    if not rows:
        return ""
    head = ["system", *(c[2] for c in columns)]
    return ("| " + " | ".join(head) + " |\n|" + "---|" * len(head) + "\n" + "\n".join(rows) + "\n\n"
            f"The same at the level each mark is decided at: the difference the test behind the system's mark (the recipe's where there "
            f"is one) detects with probability {power:.0%} at the level Holm's step-down procedure required of its p-value (α / (m − i + 1) "
            f"for the i-th smallest of the family's m p-values while every smaller one is rejected; from the first that is not, that "
            f"step's level for it and every later one; tied p-values at the first step of their group; α = {comparison.settings.alpha:g}), "
            "and the matched seeds the recipe test "
            "would need at that level for the table's target differences ('none (floor X)' as above).\n")


def _runs_detectable(cell, alpha: float, power: float) -> float | None:
    """The question-only test's detectable difference: (z_{1-α/2} + z_{power}) x its standard error over questions."""
    from scipy.stats import norm

    return None if cell.runs_se is None else float((norm.ppf(1 - alpha / 2) + norm.ppf(power)) * cell.runs_se)


def seed_by_seed_table(runs: Sequence[RunResult], comparison: Comparison, ks: Sequence[int | str] = (20, 100),
                       beir_metrics: Sequence[str] = ("nDCG@10",)) -> str:
    """Each system's figure minus the baseline's at the same training seed, seed by seed ("" when no
    system shares a seed with the baseline)."""
    baseline = comparison.settings.baseline
    if baseline is None:
        return ""
    columns = _columns(runs, ks, beir_metrics)
    diffs = seed_by_seed(runs, [(d, m) for d, m, _ in columns], baseline)
    if not diffs:
        return ""
    head = ["system", *(f"Δ {c[2]}" for c in columns)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for system in _in_order(r.system for r in runs):
        cells = [diffs.get((system, d, m)) for d, m, _ in columns]
        if any(cells):
            lines.append("| " + " | ".join([system, *("–" if c is None else ", ".join(f"{seed}: {_signed(v, m)}" for seed, v in c)
                                                      for c, (_, m, _) in zip(cells, columns))]) + " |")
    return ("\n".join(lines) + f"\n\nEach cell, `seed: Δ`: the system's figure minus {baseline}'s at the same training seed "
            "(runs at one seed share the batch order, and the negatives where both draw them alike). A check, not a test: a recipe "
            "called better should be better at every seed, but one sign at every seed also happens by chance (probability 2 / 2^n "
            "over n seeds: 0.5 over 2, 0.25 over 3).\n")


def machine_table(runs: Sequence[RunResult], comparison: Comparison, ks: Sequence[int | str] = (20, 100),
                  beir_metrics: Sequence[str] = ("nDCG@10",)) -> str:
    """Each recipe test whose seeds ran on more than one machine, machine by machine: the difference
    over each machine's seeds and the test of the machine x recipe interaction (`machine_split`);
    machines named by letter under the table ("" when every test ran on one machine)."""
    columns = _columns(runs, ks, beir_metrics)
    splits = {key: cell.recipe.by_machine for key, cell in comparison.cells.items() if cell.recipe is not None and cell.recipe.by_machine}
    if not splits:
        return ""
    letters: dict[str, str] = {}
    for split in splits.values():
        for machine, _, _ in split.deltas:
            letters.setdefault(machine, chr(ord("A") + len(letters)))

    def cell(split, metric: str) -> str:
        if split is None:
            return "–"
        parts = " · ".join(f"{letters[m]} {_signed(d, metric)} ({', '.join(map(str, seeds))})" for m, d, seeds in split.deltas)
        return parts + ("; no test (one seed per machine)" if split.p is None else f"; p={split.p:.2g}")

    head = ["system", *(f"Δ {c[2]}" for c in columns)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for system in _in_order(r.system for r in runs):
        found = [splits.get((system, d, m)) for d, m, _ in columns]
        if any(found):
            lines.append("| " + " | ".join([system, *(cell(f, m) for f, (_, m, _) in zip(found, columns))]) + " |")
    legend = "; ".join(f"{letter}: {machine}" for machine, letter in letters.items())
    return ("\n".join(lines) + f"\n\nEach cell, `machine Δ (seeds)`: the recipe test's difference from {comparison.settings.baseline} over the "
            "seeds that ran on that machine (both systems' runs of a seed on one machine), and p: whether the difference changes "
            "with the machine more than with the seed (the machine x recipe interaction: a one-way analysis of variance of the "
            "seeds' mean differences by machine, F on (machines − 1, seeds − machines) df; uncorrected, and with few seeds per "
            f"machine it sees only large changes). Machines: {legend}.\n")


def seed_checks_markdown(runs: Sequence[RunResult], settings: StatsSettings | None = None, ks: Sequence[int | str] = (20, 100),
                         beir_metrics: Sequence[str] = ("nDCG@10",)) -> str:
    """"## Seed against seed": every two seeds of each system under the paired test over questions
    (uncorrected), so a reader sees how often the seed alone passes for a significant difference
    ("" when no system has two seeds with per-query outcomes)."""
    s = settings or StatsSettings()
    check_beir_metrics(beir_metrics)
    columns = _columns(runs, ks, beir_metrics)
    pairs = seed_against_seed(runs, [(d, m) for d, m, _ in columns], s)
    if not pairs:
        return ""
    by_cell: dict[tuple[str, str, str], list[SeedPair]] = {}
    for pair in pairs:
        by_cell.setdefault((pair.system, pair.dataset, pair.metric), []).append(pair)
    head = ["system", *(c[2] for c in columns)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def cell(mine: list[SeedPair] | None, metric: str) -> str:
        if not mine:
            return "–"
        rejected = sum(p.p < s.alpha for p in mine)
        return f"{rejected} of {len(mine)} (largest Δ {_number(max(abs(p.delta) for p in mine), metric)})"

    for system in _in_order(p.system for p in pairs):
        lines.append("| " + " | ".join([system, *(cell(by_cell.get((system, d, m)), m) for d, m, _ in columns)]) + " |")
    rejected = sum(p.p < s.alpha for p in pairs)
    return ("## Seed against seed\n\n" + "\n".join(lines)
            + f"\n\nEach cell: of the pairs of the system's seeds, how many differ at p < {s.alpha:g} under the test of these runs above "
            "(the paired sign-flip test over questions, exact where the outcomes allow), uncorrected, and the largest difference (in "
            "absolute value) between two of its seeds. In all "
            f"{rejected} of {len(pairs)} such tests reject. Two seeds of one recipe are two trained models: when they \"differ "
            "significantly\", the test over questions is telling these runs apart, not recipes, and a significant difference between "
            "two systems that is no larger than these is not, by itself, evidence that their recipes differ.\n")


def reference_table(runs: Sequence[RunResult]) -> str:
    """Each table row's figures as its paper reports them (results.json's `reference`, written by
    scripts/experiment.py from the table's config) beside the mean over this system's seeds; where
    some system has figures, the others are listed as not reported."""
    rows = []
    any_reference = any(r.reference for r in runs)
    for system in _in_order(r.system for r in runs):
        mine = [r for r in runs if r.system == system]
        reference = next((r.reference for r in mine if r.reference), {})
        if not reference and any_reference:
            rows.append(f"| {system} | {mine[0].dataset} | – | not reported | – ({len(mine)} run(s)) | – |")
        for name, paper in reference.items():
            metric, reached = _reached(name, mine)
            here = sum(reached) / len(reached) if reached else None
            delta = f"{here - paper:+.1f}" if here is not None else "–"
            rows.append(f"| {system} | {mine[0].dataset} | {metric} | {paper:.1f} | {_fmt(here)} ({len(reached)} run(s)) | {delta} |")
    if not rows:
        return ""
    return "| system | dataset | metric | paper | here, mean | here − paper |\n|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n"


def _reached(name: str, runs: Sequence[RunResult]) -> tuple[str, list[float]]:
    """A reference figure's metric as the table names it, and each run's value of it: `top20` (top-k
    accuracy), `EM@10` (a reader's exact match reading the first 10 passages), or `EM` (a paper's
    end-to-end figure whose k is not given: the largest k each run read)."""
    if name == "EM":
        values, ks = [], set()
        for r in runs:
            read = [int(m.removeprefix("EM@")) for m in r.metrics if m.startswith("EM@")]
            if read:
                ks.add(max(read))
                values.append(r.metrics[f"EM@{max(read)}"])
        return "EM (" + ("largest k read: " + ", ".join(map(str, sorted(ks))) if ks else "no reading") + ")", values
    if name.startswith("EM@"):
        return name, [r.metrics[name] for r in runs if name in r.metrics]
    k = name.removeprefix("top")
    return f"top-{k}", [r.top_k[k] for r in runs if k in r.top_k]


def _fmt(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f}"
