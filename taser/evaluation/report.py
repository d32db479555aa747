"""One report from the `results.json` of any set of runs: a paper-style markdown table (rows:
systems with their parameter counts; columns: datasets, top-k accuracy or BEIR metrics), the
per-relation table of EntityQuestions runs, and a top-k accuracy curve (k = 1..100) per
dataset as a PNG (matplotlib, Agg backend: no display needed).

A run is what `scripts/evaluate.py` writes: `task` (qa, beir, entity_questions), `dataset`, the
retriever's settings, `parameters` (dense models), `top_k` or `metrics`, and `top_k_curve`. A
system's name is the run's `name` when given at evaluation, else one made from its retriever
and model (`system_name`); one system's runs on several datasets share a row.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from taser.data.errors import DataFormatError
from taser.io import atomic_open, atomic_path

log = logging.getLogger(__name__)

RESULTS_FILE = "results.json"
TASKS = ("qa", "beir", "entity_questions")
BEIR_METRICS = ("nDCG@10", "nDCG@100", "Recall@10", "Recall@100", "MRR@10")


@dataclass
class RunResult:
    system: str
    dataset: str
    task: str = "qa"
    parameters: int | None = None
    top_k: dict[str, float] = field(default_factory=dict)  # qa, entity_questions: percent at k
    metrics: dict[str, float] = field(default_factory=dict)  # beir: fractions
    curve: list[float] = field(default_factory=list)  # percent at k = 1..len
    relations: dict[str, dict[str, float]] = field(default_factory=dict)  # entity_questions: relation -> top_k
    extra: dict[str, str] = field(default_factory=dict)  # more columns (the demo's training figures)
    path: str | None = None


def _short(path: str | None) -> str:
    parts = Path(str(path)).parts if path else ()
    return "/".join(parts[-2:]) if parts else "?"


def system_name(results: dict) -> str:
    """The run's `name`, else its retriever and model: "BM25 (Lucene, k1=0.9, b=0.4)",
    "dpr (train/final)", "hybrid: BM25 + dpr (train/final), λ=1.1"."""
    if results.get("name"):
        return str(results["name"])
    retriever = results.get("retriever")
    bm25 = results.get("bm25") or {}
    engine = {"pyserini": "Lucene"}.get(bm25.get("backend"), bm25.get("backend", "?"))
    dense = f"{results.get('model_type', 'dense')} ({_short(results.get('model'))})"
    if retriever == "bm25":
        return f"BM25 ({engine}, k1={bm25.get('k1', 0):g}, b={bm25.get('b', 0):g})"
    if retriever == "hybrid":
        return f"hybrid: BM25 + {dense}, λ={results.get('lambda', 0):g}"
    return dense


def _require(results: dict, key: str, kind, path) -> object:
    if key not in results:
        raise DataFormatError(path, "top level", f"missing field {key!r}: not a results.json of scripts/evaluate.py")
    if not isinstance(results[key], kind):
        raise DataFormatError(path, f"field {key!r}", f"expected {getattr(kind, '__name__', kind)}, got {type(results[key]).__name__}")
    return results[key]


def read_run(path: str | os.PathLike) -> RunResult:
    """A run from its `results.json`; runs written before `task` and `dataset` existed read as QA runs."""
    path = Path(path)
    try:
        results = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise DataFormatError(path, f"line {e.lineno}, column {e.colno}", f"invalid JSON ({e.msg})") from None
    if not isinstance(results, dict):
        raise DataFormatError(path, "top level", f"expected a JSON object, got {type(results).__name__}")
    task = results.get("task", "qa")
    if task not in TASKS:
        raise DataFormatError(path, "field 'task'", f"unknown task {task!r}; expected one of {', '.join(TASKS)}")
    run = RunResult(system_name(results), str(results.get("dataset") or path.parent.name), task, results.get("parameters"), path=str(path))
    if task == "beir":
        run.metrics = {str(k): float(v) for k, v in _require(results, "metrics", dict, path).items()}
    else:
        run.top_k = {str(k): float(v) for k, v in _require(results, "top_k", dict, path).items()}
    if task == "entity_questions":
        run.relations = {rel: r.get("top_k", {}) for rel, r in _require(results, "relations", dict, path).items()}
    curve = results.get("top_k_curve", [])
    if not isinstance(curve, list) or not all(isinstance(v, (int, float)) for v in curve):
        raise DataFormatError(path, "field 'top_k_curve'", "expected a list of numbers")
    run.curve = [float(v) for v in curve]
    return run


def find_results(paths: Iterable[str | os.PathLike]) -> list[Path]:
    """The results files named, or found under the directories named. A directory holding a
    `results.json` is one run: what lies below it (per-relation files, indexes) is not searched."""
    found: list[Path] = []
    for given in paths:
        path = Path(given)
        if path.is_file():
            found.append(path)
        elif path.is_dir():
            found += _walk(path)
        else:
            raise FileNotFoundError(f"no results file or directory: {path}")
    if not found:
        raise FileNotFoundError(f"no {RESULTS_FILE} under {', '.join(str(p) for p in paths)}")
    return found


def _walk(directory: Path) -> list[Path]:
    if (directory / RESULTS_FILE).is_file():
        return [directory / RESULTS_FILE]
    return [f for sub in sorted(p for p in directory.iterdir() if p.is_dir() and not p.name.startswith(".")) for f in _walk(sub)]


def read_runs(paths: Iterable[str | os.PathLike]) -> list[RunResult]:
    """The runs of `find_results(paths)`; two runs of one system on one dataset are an error."""
    runs = [read_run(p) for p in find_results(paths)]
    seen: dict[tuple[str, str], RunResult] = {}
    for run in runs:
        other = seen.setdefault((run.system, run.dataset), run)
        if other is not run:
            raise ValueError(f"two runs of {run.system!r} on {run.dataset!r}: {other.path} and {run.path}; "
                             "give one of them another name (evaluate.py name=...)")
    return runs


def check_beir_metrics(names: Sequence[str]) -> None:
    unknown = [m for m in names if m not in BEIR_METRICS]
    if unknown:
        raise ValueError(f"unknown BEIR metric(s) {unknown}; expected some of {', '.join(BEIR_METRICS)}")


def _in_order(values: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(values))


def _fmt_params(n: int | None) -> str:
    return "–" if n is None else f"{n / 1e6:.1f}M"


def _columns(runs: Sequence[RunResult], ks: Sequence[int | str], beir_metrics: Sequence[str]) -> list[tuple[str, str, str]]:
    """(dataset, metric, header) of each metric column, datasets in order of first appearance."""
    kind = {}
    for run in runs:
        kind.setdefault(run.dataset, run.task)
    columns = []
    for dataset, task in kind.items():
        metrics = list(beir_metrics) if task == "beir" else [f"top-{k}" for k in ks]
        columns += [(dataset, m, f"{dataset} {m}") for m in metrics]
    return columns


def _cell(run: RunResult | None, metric: str) -> str:
    if run is None:
        return "–"
    if metric.startswith("top-"):
        value = run.top_k.get(metric.removeprefix("top-"))
        return "–" if value is None else f"{value:.1f}"
    value = run.metrics.get(metric)
    return "–" if value is None else f"{value:.3f}"


def markdown_table(runs: Sequence[RunResult], ks: Sequence[int | str] = (20, 100), beir_metrics: Sequence[str] = ("nDCG@10",)) -> str:
    """Rows: systems (in order of first appearance); columns: each dataset's top-k (QA,
    EntityQuestions: its macro average) or BEIR metrics, the parameter count, then any `extra`."""
    check_beir_metrics(beir_metrics)
    by = {(r.system, r.dataset): r for r in runs}
    systems = _in_order(r.system for r in runs)
    columns = _columns(runs, ks, beir_metrics)
    extras = _in_order(key for r in runs for key in r.extra)
    head = ["system", *(c[2] for c in columns), "parameters", *extras]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for system in systems:
        mine = [r for r in runs if r.system == system]
        params = next((r.parameters for r in mine if r.parameters is not None), None)
        extra = {k: v for r in mine for k, v in r.extra.items()}
        cells = [system, *(_cell(by.get((system, d)), m) for d, m, _ in columns), _fmt_params(params), *(extra.get(k, "–") for k in extras)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def relations_table(runs: Sequence[RunResult], ks: Sequence[int | str] = (20, 100)) -> str:
    """EntityQuestions per relation: rows relations then the macro average; columns each system's top-k."""
    eq = [r for r in runs if r.task == "entity_questions"]
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
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    try:
        for run in mine:
            ax.plot(range(1, len(run.curve) + 1), run.curve, label=run.system, linewidth=1.6)
        ax.set_xlabel("k (passages retrieved)")
        ax.set_ylabel("queries with a relevant passage in the top k (%)" if task == "beir" else
                      "top-k accuracy (%)" + (", macro average" if task == "entity_questions" else ""))
        ax.set_title(f"{dataset}: top-k accuracy")
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


def report_markdown(runs: Sequence[RunResult], plots: dict[str, str], ks: Sequence[int | str] = (20, 100),
                    beir_metrics: Sequence[str] = ("nDCG@10",), title: str = "Retrieval results") -> str:
    text = f"# {title}\n\n" + markdown_table(runs, ks, beir_metrics)
    text += ("\nTop-k: % of questions with an answer in the first k passages (EntityQuestions: the macro average over relations). "
             "BEIR: fractions, computed by pytrec_eval with BEIR's conventions.\n")
    relations = relations_table(runs, ks)
    if relations:
        text += "\n## EntityQuestions by relation\n\n" + relations
    if plots:
        text += "\n## Top-k accuracy curves\n"
        for dataset, file in plots.items():
            text += f"\n### {dataset}\n\n![top-k accuracy on {dataset}]({file})\n"
    return text


def write_report(runs: Sequence[RunResult], out_dir: str | os.PathLike, ks: Sequence[int | str] = (20, 100),
                 beir_metrics: Sequence[str] = ("nDCG@10",), title: str = "Retrieval results") -> dict:
    """`out_dir/report.md` and a `topk-<dataset>.png` per dataset with curves; returns
    {"report": path, "plots": {dataset: path}, "markdown": text}. The plots are written first,
    the markdown last."""
    if not runs:
        raise ValueError("no runs to report")
    check_beir_metrics(beir_metrics)
    out = Path(out_dir)
    plots: dict[str, str] = {}
    for dataset in _in_order(r.dataset for r in runs):
        if plot_curves(runs, dataset, out / plot_file_name(dataset)) is not None:
            plots[dataset] = plot_file_name(dataset)
    text = report_markdown(runs, plots, ks, beir_metrics, title)
    with atomic_open(out / "report.md") as f:
        f.write(text)
    return {"report": str(out / "report.md"), "plots": {d: str(out / f) for d, f in plots.items()}, "markdown": text}
