"""One report from the `results.json` of any set of runs: a paper-style markdown table (rows:
systems with their parameter counts; columns: datasets, top-k accuracy or BEIR metrics), the
per-relation table of EntityQuestions runs, and a top-k accuracy curve (k = 1..100) per
dataset as a PNG (matplotlib, Agg backend: no display needed).

Runs are read by `taser.evaluation.runs`. Runs of one system on one dataset over several
training seeds make one cell: mean ± standard deviation, with n in the `seeds` column. Where the
runs wrote per-question outcomes, each cell also carries a bootstrap confidence interval over
questions, and, with a `baseline` system, a mark when it differs significantly from the
baseline's (`taser.evaluation.comparison`); a note under the table says which test, which
correction, and how many seeds and questions. Systems with several seeds add the seed checks of
`taser.evaluation.seed_checks`: each system against the baseline seed by seed, and every two
seeds of one system under the same test.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from taser.evaluation.comparison import Comparison, StatsSettings, compare, note
from taser.evaluation.runs import (
    BEIR_METRICS,
    RESULTS_FILE,
    TASKS,
    RunResult,
    check_beir_metrics,
    find_results,
    read_run,
    read_runs,
    system_name,
)
from taser.evaluation.seed_checks import SeedPair, seed_against_seed, seed_by_seed
from taser.io import atomic_open, atomic_path

__all__ = ["BEIR_METRICS", "RESULTS_FILE", "TASKS", "RunResult", "StatsSettings", "check_beir_metrics", "find_results", "markdown_table",
           "plot_curves", "plot_file_name", "read_run", "read_runs", "relations_table", "report_markdown", "seed_checks_markdown", "system_name",
           "table_stats", "write_report"]

log = logging.getLogger(__name__)

SIGNIFICANT = "†"


def _in_order(values: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(values))


def _fmt_params(n: int | None) -> str:
    return "–" if n is None else f"{n / 1e6:.1f}M"


def _columns(runs: Sequence[RunResult], ks: Sequence[int | str], beir_metrics: Sequence[str]) -> list[tuple[str, str, str]]:
    """(dataset, metric, header) of each metric column, datasets in order of first appearance; a
    dataset with reader runs has EM@k columns after its top-k ones (the reader rows fill both)."""
    kinds: dict[str, set[str]] = {}
    for run in runs:
        kinds.setdefault(run.dataset, set()).add(run.task)
    columns = []
    for dataset, tasks in kinds.items():
        metrics = list(beir_metrics) if tasks == {"beir"} else [f"top-{k}" for k in ks]
        if "reader" in tasks:
            metrics += [f"EM@{k}" for k in ks]
        columns += [(dataset, m, f"{dataset} {m}") for m in metrics]
    return columns


def _number(value: float, metric: str) -> str:
    """BEIR's metrics are fractions (3 decimals); top-k, EM and F1 are percentages (1 decimal)."""
    return f"{value:.3f}" if metric in BEIR_METRICS else f"{value:.1f}"


def _cell(comparison: Comparison, system: str, dataset: str, metric: str) -> str:
    """"56.4", or with seeds "56.4 ± 0.3", with an interval "... [54.2, 58.6]", and † when significant."""
    cell = comparison.cells.get((system, dataset, metric))
    if cell is None:
        return "–"
    text = _number(cell.spread.mean, metric)
    if cell.spread.std is not None:
        text += " ± " + _number(cell.spread.std, metric)
    if cell.interval is not None:
        text += f" [{_number(cell.interval[0], metric)}, {_number(cell.interval[1], metric)}]"
    return text + (f" {SIGNIFICANT}" if cell.significant else "")


def _table_stats(runs: Sequence[RunResult], ks, beir_metrics, stats: StatsSettings | None,
                 reuse: Comparison | None = None) -> tuple[list[tuple[str, str, str]], Comparison]:
    check_beir_metrics(beir_metrics)
    columns = _columns(runs, ks, beir_metrics)
    return columns, compare(runs, [(d, m) for d, m, _ in columns], stats, reuse)


def table_stats(runs: Sequence[RunResult], ks: Sequence[int | str] = (20, 100), beir_metrics: Sequence[str] = ("nDCG@10",),
                stats: StatsSettings | None = None, reuse: Comparison | None = None) -> Comparison:
    """The statistics of the report table's cells, for `report_markdown(comparison=...)`; `reuse`:
    another baseline's comparison of the same runs, whose intervals are taken (see `compare`)."""
    return _table_stats(runs, ks, beir_metrics, stats, reuse)[1]


def markdown_table(runs: Sequence[RunResult], ks: Sequence[int | str] = (20, 100), beir_metrics: Sequence[str] = ("nDCG@10",),
                   stats: StatsSettings | None = None, comparison: Comparison | None = None) -> str:
    """Rows: systems (in order of first appearance); columns: each dataset's top-k (QA,
    EntityQuestions: its macro average) or BEIR metrics, the seeds (when any run records one), the
    parameter count, then any `extra`. `comparison`: `compare`'s result for these columns, when made already."""
    columns, made = _table_stats(runs, ks, beir_metrics, stats) if comparison is None else (_columns(runs, ks, beir_metrics), comparison)
    systems = _in_order(r.system for r in runs)
    extras = _in_order(key for r in runs for key in r.extra)
    with_seeds = any(r.seed is not None for r in runs)
    head = ["system", *(c[2] for c in columns), *(["seeds"] if with_seeds else []), "parameters", *extras]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for system in systems:
        mine = [r for r in runs if r.system == system]
        params = next((r.parameters for r in mine if r.parameters is not None), None)
        extra = {k: v for r in mine for k, v in r.extra.items()}
        seeds = [str(made.seeds[system]) if made.seeded.get(system) else "–"] if with_seeds else []
        cells = [system, *(_cell(made, system, d, m) for d, m, _ in columns), *seeds, _fmt_params(params), *(extra.get(k, "–") for k in extras)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def differences_table(runs: Sequence[RunResult], comparison: Comparison, ks: Sequence[int | str] = (20, 100),
                      beir_metrics: Sequence[str] = ("nDCG@10",)) -> str:
    """Each system's difference from the baseline (seed-averaged, per question) with its Holm-adjusted
    p-values: the recipe's (`recipe p`, seeds as a random effect) where both have several seeds, and these runs' (`runs p`)."""
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
                cells.append(f"{_signed(cell.delta, metric)} (recipe p={cell.recipe_holm:.2g}; runs p={cell.p_holm:.2g})"
                             + (f" {SIGNIFICANT}" if cell.significant else ""))
            else:
                cells.append(f"{_signed(cell.delta, metric)} (p={cell.p_holm:.2g})" + (f" {SIGNIFICANT}" if cell.significant else ""))
        if system != comparison.settings.baseline:
            lines.append("| " + " | ".join([system, *cells]) + " |")
    return "\n".join(lines) + "\n"


def detectable_table(runs: Sequence[RunResult], comparison: Comparison, ks: Sequence[int | str] = (20, 100),
                     beir_metrics: Sequence[str] = ("nDCG@10",)) -> str:
    """Per column: the smallest difference detectable at `power` (alpha as the table's, before Holm)
    by the recipe test (median over the systems tested, at their seeds) and by the test of these
    runs; and the matched seeds a recipe test would need for 1 and 2 points (at the observed variance)."""
    from taser.evaluation.recipes import seeds_needed

    alpha, power, targets = comparison.settings.alpha, comparison.settings.power, tuple(comparison.settings.seeds_for)
    lines = []
    for dataset, metric, label in _columns(runs, ks, beir_metrics):
        cells = [c for k, c in comparison.cells.items() if k[1:] == (dataset, metric) and c.p is not None]
        recipes = [c.recipe for c in cells if c.recipe is not None and c.recipe.design == "paired by seed"]
        runs_mdd = [_runs_detectable(c, alpha, power) for c in cells]
        runs_mdd = [m for m in runs_mdd if m is not None]
        if not recipes and not runs_mdd:
            continue
        recipe_mdd = sorted(r.detectable(alpha, power) for r in recipes)
        seeds = sorted({len(r.seeds) for r in recipes})
        median = recipe_mdd[len(recipe_mdd) // 2] if recipe_mdd else None
        need = {}
        for target in targets:
            if metric in BEIR_METRICS or not recipes:  # the targets are points of a percentage; BEIR's metrics are fractions
                need[target] = "–"
                continue
            counts = sorted((seeds_needed(r.components, target, alpha, power) or 10**9) for r in recipes)
            middle = counts[len(counts) // 2]  # the median, a system that 200 seeds do not reach counting as more
            need[target] = "> 200" if middle == 10**9 else str(middle)
        lines.append(f"| {label} | {_number(median, metric) if median is not None else '–'}"
                     f"{f' ({min(seeds)} seeds)' if seeds else ''} | "
                     f"{_number(sorted(runs_mdd)[len(runs_mdd) // 2], metric) if runs_mdd else '–'} | "
                     + " | ".join(need[t] for t in targets) + " |")
    if not lines:
        return ""
    seeds_heads = " | ".join(f"matched seeds for a recipe difference of {t:g}" for t in targets)
    return ("| column | recipe test (median over systems) | these runs, over questions | " + seeds_heads + " |\n"
            + "|---" * (3 + len(targets)) + "|\n" + "\n".join(lines) + "\n\n"
            f"The difference each test detects with probability {power:.0%} at p < {alpha:g} (two-sided, before Holm's correction): "
            "a 'no difference' in this table means no difference larger than about this. Recipe test: (t_{1-α/2} + t_{power}) x its standard "
            "error, at the seeds and questions here; seeds needed: the fewest matched seeds whose design reaches that difference at the "
            "observed variance components (median over the systems tested). These runs: the same over questions alone, which says "
            "nothing of other seeds.\n")


def _runs_detectable(cell, alpha: float, power: float) -> float | None:
    """The question-only test's detectable difference: (z_{1-α/2} + z_{power}) x its standard error over questions."""
    from scipy.stats import norm

    return None if cell.runs_se is None else float((norm.ppf(1 - alpha / 2) + norm.ppf(power)) * cell.runs_se)


def _signed(value: float, metric: str) -> str:
    return ("+" if value >= 0 else "−") + _number(abs(value), metric)


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


def relations_table(runs: Sequence[RunResult], ks: Sequence[int | str] = (20, 100)) -> str:
    """EntityQuestions per relation: rows relations then the macro average; columns each system's top-k."""
    eq = _seed_means([r for r in runs if r.task == "entity_questions"])
    if not eq:
        return ""
    relations = _in_order(rel for r in eq for rel in r.relations)
    head = ["relation", *(f"{r.system} top-{k}" for r in eq for k in ks)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def value(top_k: dict, k) -> str:
        v = top_k.get(str(k))
        return "–" if v is None else f"{v:.1f}"

    for rel in relations:
        lines.append("| " + " | ".join([rel, *(value(r.relations.get(rel, {}), k) for r in eq for k in ks)]) + " |")
    lines.append("| " + " | ".join(["**macro average**", *(value(r.top_k, k) for r in eq for k in ks)]) + " |")
    return "\n".join(lines) + "\n"


def _seed_means(runs: Sequence[RunResult]) -> list[RunResult]:
    """One run per system: its runs' top-k per relation and macro top-k averaged over seeds."""
    groups: dict[str, list[RunResult]] = {}
    for run in runs:
        groups.setdefault(run.system, []).append(run)

    def mean(dicts: list[dict]) -> dict:
        keys = _in_order(k for d in dicts for k in d)
        return {k: sum(d[k] for d in dicts if k in d) / sum(1 for d in dicts if k in d) for k in keys}

    return [RunResult(system, mine[0].dataset, mine[0].task, top_k=mean([r.top_k for r in mine]),
                      relations={rel: mean([r.relations[rel] for r in mine if rel in r.relations]) for rel in _in_order(x for r in mine for x in r.relations)})
            for system, mine in groups.items()]


def plot_file_name(dataset: str) -> str:
    return "topk-" + (re.sub(r"[^A-Za-z0-9._-]+", "-", dataset).strip("-") or "dataset") + ".png"


def plot_curves(runs: Sequence[RunResult], dataset: str, path: str | os.PathLike) -> Path | None:
    """The top-k accuracy curves of `dataset`'s runs as a PNG at `path` (atomically); None when
    no run of it has a curve."""
    import matplotlib

    matplotlib.use("Agg")  # files only; never a display
    import matplotlib.pyplot as plt

    mine = [r for r in runs if r.dataset == dataset and r.curve]
    if not mine:
        log.info("%s: no run has a top-k curve; no plot", dataset)
        return None
    task = mine[0].task
    groups: dict[str, list[list[float]]] = {}
    for run in mine:
        groups.setdefault(run.system, []).append(run.curve)
    spread = False
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    try:
        for system, curves in groups.items():
            length = min(len(c) for c in curves)
            ks = range(1, length + 1)
            mean = [sum(c[i] for c in curves) / len(curves) for i in range(length)]
            label = system if len(curves) == 1 else f"{system} (mean of {len(curves)} seeds)"
            (line,) = ax.plot(ks, mean, label=label, linewidth=1.6)
            if len(curves) > 1:  # the spread over seeds: shaded from the lowest to the highest run at each k
                ax.fill_between(ks, [min(c[i] for c in curves) for i in range(length)], [max(c[i] for c in curves) for i in range(length)],
                                color=line.get_color(), alpha=0.2, linewidth=0)
                spread = True
        ax.set_xlabel("k (passages retrieved)")
        ax.set_ylabel("queries with a relevant passage in the top k (%)" if task == "beir" else
                      "top-k accuracy (%)" + (", macro average" if task == "entity_questions" else ""))
        ax.set_title(f"{dataset}: top-k accuracy" + (" (shaded: min-max over seeds)" if spread else ""))
        ax.set_xlim(1, max(len(r.curve) for r in mine))
        ax.grid(True, alpha=0.3)
        ax.legend(loc="lower right", fontsize=8)
        fig.tight_layout()
        path = Path(path)
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format="png")
    finally:
        plt.close(fig)
    return path


def reference_table(runs: Sequence[RunResult]) -> str:
    """Each table row's figures as its paper reports them (results.json's `reference`, written by
    scripts/experiment.py from the table's config) beside the mean over this system's seeds."""
    rows = []
    for system in _in_order(r.system for r in runs):
        mine = [r for r in runs if r.system == system]
        reference = next((r.reference for r in mine if r.reference), {})
        for name, paper in reference.items():
            k = name.removeprefix("top")
            reached = [r.top_k[k] for r in mine if k in r.top_k]
            here = sum(reached) / len(reached) if reached else None
            delta = f"{here - paper:+.1f}" if here is not None else "–"
            rows.append(f"| {system} | {mine[0].dataset} | top-{k} | {paper:.1f} | {_fmt(here)} ({len(reached)} run(s)) | {delta} |")
    if not rows:
        return ""
    return "| system | dataset | metric | paper | here, mean | here − paper |\n|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n"


def _fmt(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f}"


def report_markdown(runs: Sequence[RunResult], plots: dict[str, str], ks: Sequence[int | str] = (20, 100),
                    beir_metrics: Sequence[str] = ("nDCG@10",), title: str = "Retrieval results",
                    stats: StatsSettings | None = None, comparison: Comparison | None = None, seed_checks: bool = True) -> str:
    """The report's markdown; `seed_checks`: add the "Seed against seed" section (a caller writing
    several tables of the same runs puts it once)."""
    if comparison is None:
        comparison = _table_stats(runs, ks, beir_metrics, stats)[1]
    text = f"# {title}\n\n" + markdown_table(runs, ks, beir_metrics, comparison=comparison)
    text += ("\nTop-k: % of questions with an answer in the first k passages (EntityQuestions: the macro average over relations). "
             "BEIR: fractions, computed by pytrec_eval with BEIR's conventions.")
    if any(r.task == "reader" for r in runs):
        text += (" EM@k: % of questions whose reader answer, taken from the best of the retriever's first k passages, equals an "
                 "accepted answer after SQuAD's normalisation (a reader row's top-k: its retriever's on the questions it read).")
    explained = note(comparison)
    text += "\n" + ("".join(f"\n- {part}" for part in explained) + "\n" if explained else "")
    differences = differences_table(runs, comparison, ks, beir_metrics)
    if differences:
        text += (f"\n## Paired differences against {comparison.settings.baseline}\n\n" + differences
                 + "\nΔ: the system's figure minus the baseline's (per question, seeds averaged); p: Holm-adjusted. recipe p: seeds as "
                 "a random effect (runs paired by seed); runs p: these runs over questions (exact sign flips); † follows the recipe p "
                 "where there is one.\n")
        power = detectable_table(runs, comparison, ks, beir_metrics)
        if power:
            text += (f"\n## The smallest difference this table can see (against {comparison.settings.baseline})\n\n" + power)
    by_seed = seed_by_seed_table(runs, comparison, ks, beir_metrics)
    if by_seed:
        text += f"\n## Against {comparison.settings.baseline}, seed by seed\n\n" + by_seed
    if seed_checks:
        checks = seed_checks_markdown(runs, comparison.settings, ks, beir_metrics)
        if checks:
            text += "\n" + checks
    papers = reference_table(runs)
    if papers:
        text += "\n## Beside the papers' figures\n\n" + papers
    relations = relations_table(runs, ks)
    if relations:
        text += "\n## EntityQuestions by relation\n\n" + relations
    if plots:
        text += "\n## Top-k accuracy curves\n"
        for dataset, file in plots.items():
            text += f"\n### {dataset}\n\n![top-k accuracy on {dataset}]({file})\n"
    return text


def write_report(runs: Sequence[RunResult], out_dir: str | os.PathLike, ks: Sequence[int | str] = (20, 100),
                 beir_metrics: Sequence[str] = ("nDCG@10",), title: str = "Retrieval results", stats: StatsSettings | None = None,
                 inspect: Sequence[str] = (), inspect_k: int = 20) -> dict:
    """`out_dir/report.md` and a `topk-<dataset>.png` per dataset with curves; returns
    {"report": path, "plots": {dataset: path}, "markdown": text, "comparison": the statistics}.
    The statistics are computed first (a bad baseline stops before any file is written), then the
    plots, the markdown last."""
    if not runs:
        raise ValueError("no runs to report")
    comparison = _table_stats(runs, ks, beir_metrics, stats)[1]
    out = Path(out_dir)
    plots: dict[str, str] = {}
    for dataset in _in_order(r.dataset for r in runs):
        if plot_curves(runs, dataset, out / plot_file_name(dataset)) is not None:
            plots[dataset] = plot_file_name(dataset)
    pages = inspection_pages(runs, out, inspect, inspect_k, comparison, plots, ks, beir_metrics, stats) if inspect else []
    text = report_markdown(runs, plots, ks, beir_metrics, title, comparison=comparison)
    if pages:
        text += "\n## Inspection pages\n\n" + "".join(f"- [{p.name}]({p.name})\n" for p in pages)
    with atomic_open(out / "report.md") as f:
        f.write(text)
    return {"report": str(out / "report.md"), "plots": {d: str(out / f) for d, f in plots.items()}, "markdown": text, "comparison": comparison,
            "pages": [str(p) for p in pages]}


def inspection_pages(runs: Sequence[RunResult], out: Path, systems: Sequence[str], k: int, comparison: Comparison, plots: dict,
                     ks, beir_metrics, stats: StatsSettings | None) -> list[Path]:
    """One page per inspected system and dataset against the baseline (`taser.evaluation.inspect_page`)."""
    from taser.evaluation.inspect_page import page_name, write_inspection_page

    baseline = comparison.settings.baseline
    if baseline is None:
        raise ValueError("inspect=... needs baseline=<the system to compare against>")
    if k not in [int(x) for x in ks if str(x).isdigit()]:
        comparison = _table_stats(runs, [*ks, k], beir_metrics, stats)[1]  # the page's column's tests
    pages = []
    for system in systems:
        found = [r for r in runs if r.system == system]
        if not found:
            raise ValueError(f"inspect={system!r} is none of the systems: {', '.join(sorted({r.system for r in runs}))}")
        for dataset in _in_order(r.dataset for r in found):
            mine = [r for r in found if r.dataset == dataset]
            theirs = [r for r in runs if r.system == baseline and r.dataset == dataset]
            if not theirs:
                continue
            path = out / page_name(system, baseline, dataset, k)
            pages.append(write_inspection_page(path, mine, theirs, k, comparison, out / plots[dataset] if dataset in plots else None))
    return pages
