"""One report from the `results.json` of any set of runs: a paper-style markdown table (rows:
systems with their parameter counts; columns: datasets, top-k accuracy or BEIR metrics), the
per-relation table of EntityQuestions runs, and a top-k accuracy curve (k = 1..100) per
dataset as a PNG (matplotlib, Agg backend: no display needed).

Runs are read by `taser.evaluation.runs`. Runs of one system on one dataset over several
training seeds make one cell: mean ± standard deviation, with n in the `seeds` column. Where the
runs wrote per-question outcomes, each cell also carries a bootstrap confidence interval over
questions, and, with a `baseline` system, a mark when it differs significantly from the
baseline's (`taser.evaluation.comparison`); a note under the table says which test, which
correction, and how many seeds and questions. The tables of differences against the baseline
(and the seed checks, and each row beside its paper's figures) are `taser.evaluation.difference_tables`;
the curves `taser.evaluation.curves`; this module assembles them.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path

from taser.evaluation.comparison import Comparison, StatsSettings, compare, note, one_family
from taser.evaluation.curves import plot_curves, plot_file_name
from taser.evaluation.difference_tables import (
    detectable_table,
    differences_table,
    machine_table,
    reference_table,
    seed_by_seed_table,
    seed_checks_markdown,
)
from taser.evaluation.runs import (
    BEIR_METRICS,
    RESULTS_FILE,
    TASKS,
    RunResult,
    check_beir_metrics,
    find_results,
    read_run,
    read_runs,
    report_ks,
    system_name,
)
from taser.evaluation.table_format import SIGNIFICANT, _columns, _fmt_params, _in_order, _number, _seed_means
from taser.io import atomic_open

__all__ = ["BEIR_METRICS", "RESULTS_FILE", "TASKS", "RunResult", "StatsSettings", "check_beir_metrics", "differences_table", "find_results",
           "machine_table", "markdown_table", "plot_curves", "plot_file_name", "read_run", "read_runs", "reference_table", "relations_table", "report_markdown",
           "seed_by_seed_table", "seed_checks_markdown", "system_name", "table_stats", "write_report"]

log = logging.getLogger(__name__)

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


def tables_against(runs: Sequence[RunResult], baselines: Sequence[str], ks: Sequence[int | str] = (20, 100),
                   beir_metrics: Sequence[str] = ("nDCG@10",), family: str = "study", **settings) -> dict[str, Comparison]:
    """One table's statistics per baseline (those among the runs' systems, in the order given), the
    intervals drawn once. `family`: "study", Holm's correction over every table's comparisons as one
    family (a comparison shown in two tables counted once: `comparison.one_family`); "table", each
    table its own. `settings`: `StatsSettings`' other fields."""
    if family not in ("study", "table"):
        raise ValueError(f"family must be 'study' or 'table', got {family!r}")
    systems = {r.system for r in runs}
    tables: dict[str, Comparison] = {}
    for baseline in (b for b in baselines if b in systems):
        tables[baseline] = table_stats(runs, ks, beir_metrics, StatsSettings(baseline=baseline, **settings), reuse=next(iter(tables.values()), None))
    if family == "study" and len(tables) > 1:
        one_family(list(tables.values()), f"the study's {len(tables)} tables (against {', '.join(tables)})")
    return tables


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
                 "accepted answer after SQuAD's normalisation; F1@k: that answer's token F1, the largest over the accepted answers (SQuAD's), "
                 "averaged over the questions (a reader row's top-k: its retriever's on the questions it read).")
    explained = note(comparison)
    text += "\n" + ("".join(f"\n- {part}" for part in explained) + "\n" if explained else "")
    differences = differences_table(runs, comparison, ks, beir_metrics)
    if differences:
        text += (f"\n## Paired differences against {comparison.settings.baseline}\n\n" + differences
                 + "\nΔ: the difference the mark's test tests: with a recipe p, the recipe test's (runs paired by seed: over the seeds "
                 "both systems have, and, where either has more, the difference of their means over all their seeds beside it, which "
                 "the runs p tests); else the system's figure minus the baseline's (per question, seeds averaged). p: Holm-adjusted. "
                 "recipe p: seeds as a random effect (runs paired by seed); runs p: these runs over questions (exact sign flips); † "
                 "follows the recipe p where there is one.\n")
        power = detectable_table(runs, comparison, ks, beir_metrics)
        if power:
            text += (f"\n## The smallest difference this table can see (against {comparison.settings.baseline})\n\n" + power)
    by_seed = seed_by_seed_table(runs, comparison, ks, beir_metrics)
    if by_seed:
        text += f"\n## Against {comparison.settings.baseline}, seed by seed\n\n" + by_seed
    by_machine = machine_table(runs, comparison, ks, beir_metrics)
    if by_machine:
        text += f"\n## Against {comparison.settings.baseline}, machine by machine\n\n" + by_machine
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


def write_report(runs: Sequence[RunResult], out_dir: str | os.PathLike, ks: Sequence[int | str] | None = None,
                 beir_metrics: Sequence[str] = ("nDCG@10",), title: str = "Retrieval results", stats: StatsSettings | None = None,
                 inspect: Sequence[str] = (), inspect_k: int = 20) -> dict:
    """`out_dir/report.md` and a `topk-<dataset>.png` per dataset with curves; returns
    {"report": path, "plots": {dataset: path}, "markdown": text, "comparison": the statistics}.
    The names to `inspect` are checked first, then the statistics are computed (a bad baseline stops
    before any file is written), then the plots, the inspection pages, the markdown last."""
    ks = report_ks(runs) if ks is None else ks  # None: the columns the runs' table asks for
    if not runs:
        raise ValueError("no runs to report")
    if inspect:
        check_inspect(runs, inspect, stats.baseline if stats else None)  # before any statistics: a mistyped name fails at once
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


def check_inspect(runs: Sequence[RunResult], systems: Sequence[str], baseline: str | None) -> None:
    """What `inspect=[...]` needs, checked before any statistics: a baseline, each name a system of the
    runs (a near miss is suggested) other than the baseline, on a dataset the baseline was evaluated on,
    with every run's per-question outcomes (per_query.jsonl)."""
    import difflib

    known = sorted({r.system for r in runs})
    if baseline is None:
        raise ValueError("inspect=... needs baseline=<the system to compare against>: one of " + ", ".join(map(repr, known)))
    for name in [baseline, *systems]:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1, cutoff=0.5)
            what = "baseline" if name == baseline else "inspect"
            raise ValueError(f"{what}={name!r} is none of the systems" + (f" (did you mean {close[0]!r}?)" if close else "")
                             + f": {', '.join(map(repr, known))}")
    for system in systems:
        if system == baseline:
            raise ValueError(f"inspect={system!r} is the baseline: a page compares another system with it")
        datasets = {r.dataset for r in runs if r.system == system} & {r.dataset for r in runs if r.system == baseline}
        if not datasets:
            raise ValueError(f"inspect={system!r} shares no dataset with the baseline {baseline!r}")
        missing = [r.path or r.system for r in runs if r.system in (system, baseline) and r.dataset in datasets and r.per_query is None]
        if missing:
            raise ValueError(f"inspecting {system!r} against {baseline!r} needs every run's per_query.jsonl; none beside {', '.join(map(str, missing))}")


def inspection_pages(runs: Sequence[RunResult], out: Path, systems: Sequence[str], k: int, comparison: Comparison, plots: dict,
                     ks, beir_metrics, stats: StatsSettings | None) -> list[Path]:
    """One page per inspected system and dataset against the baseline (`taser.evaluation.inspect_page`).
    A page at a k that is not a column of the report tests it beside the report's columns (another
    Holm family: the page says so)."""
    from taser.evaluation.inspect_page import page_metric, page_name, write_inspection_page

    baseline = comparison.settings.baseline
    check_inspect(runs, systems, baseline)
    report_columns = [(d, m) for d, m, _ in _columns(runs, ks, beir_metrics)]
    if k not in [int(x) for x in ks if str(x).isdigit()]:
        comparison = _table_stats(runs, [*ks, k], beir_metrics, stats)[1]  # the page's column's tests
    pages, said = [], set()
    for system in systems:
        found = [r for r in runs if r.system == system]
        for dataset in _in_order(r.dataset for r in found):
            mine = [r for r in found if r.dataset == dataset]
            theirs = [r for r in runs if r.system == baseline and r.dataset == dataset]
            if not theirs:
                log.warning("no page for %s on %s: the baseline %s has no run on it", system, dataset, baseline)
                continue
            path = out / page_name(system, baseline, dataset, page_metric([*mine, *theirs], k))
            pages.append(write_inspection_page(path, mine, theirs, k, comparison, out / plots[dataset] if dataset in plots else None,
                                               report_columns=report_columns, said=said))
            log.info("inspection page: %s", path)
    return pages
