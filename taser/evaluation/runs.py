"""Evaluation runs as the report reads them: one `results.json` (and its `per_query.jsonl`, when
the evaluation wrote one) per run, found under the directories named.

A run is what `scripts/evaluate.py` writes: `task` (qa, beir, entity_questions), `dataset`, the
retriever's settings, `parameters` (dense models), `top_k` or `metrics`, `top_k_curve`, and
`seed` (the training seed of its checkpoint; None for BM25 and untrained models). A system's name
is the run's `name` when given at evaluation, else its training run's `train.name`, else one made
from its retriever and model (`system_name`, which leaves a seed sweep's `train.seed=N` out of the
path): the runs of one system over seeds share it, and one system's runs on several datasets share
a row of the report. `scripts/read.py` writes a `reader` run: the retriever's top-k on the questions
read, and exact match and F1 at each k (`EM@k`, `F1@k` in `metrics`, in %).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from taser.data.errors import DataFormatError
from taser.evaluation.per_query import PER_QUERY_FILE, read_per_query
from taser.evaluation.topk import DEFAULT_KS

RESULTS_FILE = "results.json"
TASKS = ("qa", "beir", "entity_questions", "reader")
BEIR_METRICS = ("nDCG@10", "nDCG@100", "Recall@10", "Recall@100", "MRR@10")


@dataclass
class RunResult:
    system: str
    dataset: str
    task: str = "qa"
    parameters: int | None = None
    top_k: dict[str, float] = field(default_factory=dict)  # qa, entity_questions: percent at k
    metrics: dict[str, float] = field(default_factory=dict)  # beir: fractions; reader: EM@k and F1@k (%)
    curve: list[float] = field(default_factory=list)  # percent at k = 1..len
    relations: dict[str, dict[str, float]] = field(default_factory=dict)  # entity_questions: relation -> top_k
    extra: dict[str, str] = field(default_factory=dict)  # more columns (the demo's training figures)
    path: str | None = None
    seed: int | None = None  # the checkpoint's training seed (None: BM25, zero-shot, an imported model)
    per_query: list[dict] | None = None  # the evaluation's per-question outcomes (taser.evaluation.per_query), when written
    reference: dict[str, float] = field(default_factory=dict)  # a table row's figures from its paper ({"top20": 78.4}; scripts/experiment.py)
    report_ks: list[int] | None = None  # the top-k columns its table reports (scripts/experiment.py), when it belongs to one
    machine: str | None = None  # the CPU kind and precision results.json records (`hardware`), for the report's machine check
    outcomes_cache: dict = field(default_factory=dict, repr=False, compare=False)  # metric -> its per-question outcomes (comparison.run_outcomes)


SEED_IN_PATH = re.compile(r"(^|,)train\.seed=[^,/]*")


def _short(path: str | None) -> str:
    """The last two parts of a model path, without a seed sweep's `train.seed=N` (Hydra's multirun
    directory `model=dpr,train.seed=2` reads `model=dpr`), so the runs of one system over seeds share a name."""
    parts = [SEED_IN_PATH.sub("", part).strip(",") for part in (Path(str(path)).parts if path else ())]
    parts = [p for p in parts if p]
    return "/".join(parts[-2:]) if parts else "?"


def system_name(results: dict) -> str:
    """The run's `name`, else its recorded `system`, else its retriever and model (the dense model
    named by its training run's `train_name` when it has one): "BM25 (Lucene, k1=0.9, b=0.4)",
    "dpr (train/final)", "hybrid: BM25 + dpr (train/final), λ=1.1"."""
    for key in ("name", "system"):
        if results.get(key):
            return str(results[key])
    retriever = results.get("retriever")
    bm25 = results.get("bm25") or {}
    engine = {"pyserini": "Lucene"}.get(bm25.get("backend"), bm25.get("backend", "?"))
    dense = results.get("train_name") or f"{results.get('model_type', 'dense')} ({_short(results.get('model'))})"
    if retriever == "bm25":
        return f"BM25 ({engine}, k1={bm25.get('k1', 0):g}, b={bm25.get('b', 0):g})"
    if retriever == "hybrid":
        return f"hybrid: BM25 + {dense}, λ={results.get('lambda', 0):g}"
    return dense


def _require(results: dict, key: str, kind, path) -> object:
    if key not in results:
        raise DataFormatError(path, "top level", f"missing field {key!r}: not a results.json of taser-evaluate")
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
    elif task == "reader":
        run.top_k = {str(k): float(v) for k, v in _require(results, "top_k", dict, path).items()}
        run.metrics = {f"{name}@{k}": float(v) for name, key in (("EM", "em"), ("F1", "f1"))
                       for k, v in _require(results, key, dict, path).items()}
    else:
        run.top_k = {str(k): float(v) for k, v in _require(results, "top_k", dict, path).items()}
    if task == "entity_questions":
        run.relations = {rel: r.get("top_k", {}) for rel, r in _require(results, "relations", dict, path).items()}
    curve = results.get("top_k_curve", [])
    if not isinstance(curve, list) or not all(isinstance(v, (int, float)) for v in curve):
        raise DataFormatError(path, "field 'top_k_curve'", "expected a list of numbers")
    run.curve = [float(v) for v in curve]
    seed = results.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise DataFormatError(path, "field 'seed'", f"expected an integer or null, got {seed!r}")
    run.seed = seed
    reference = results.get("reference") or {}
    if not isinstance(reference, dict) or not all(v is None or isinstance(v, (int, float)) for v in reference.values()):
        raise DataFormatError(path, "field 'reference'", f"expected an object of figures, got {reference!r}")
    run.reference = {str(k): float(v) for k, v in reference.items() if v is not None}
    report_ks = results.get("report_ks")
    if report_ks is not None and (not isinstance(report_ks, list) or not all(isinstance(k, int) and k >= 1 for k in report_ks)):
        raise DataFormatError(path, "field 'report_ks'", f"expected a list of integers >= 1, got {report_ks!r}")
    run.report_ks = report_ks
    run.machine = machine_of(results)
    per_query = path.parent / str(results.get("per_query_file") or PER_QUERY_FILE)
    if per_query.is_file():
        run.per_query = read_per_query(per_query)
    return run


def machine_of(results: dict) -> str | None:
    """What results.json says the run ran on, as one comparable string: CPU model, capability,
    native bf16, device and precision (None when it records no hardware)."""
    h = results.get("hardware")
    if not isinstance(h, dict) or not h:
        return None
    bf16 = "native bf16" if h.get("cpu_native_bf16") else "no native bf16"
    return f"{h.get('cpu')} ({h.get('cpu_capability')}, {bf16}), {h.get('device', 'cpu')}, {results.get('precision')}"


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


DEFAULT_REPORT_KS = list(DEFAULT_KS)  # the cut-offs evaluate.py prints


def report_ks(runs: Iterable[RunResult]) -> list[int]:
    """The top-k columns the runs' tables ask for (in order, each once), else the cut-offs evaluate.py
    prints (top-1, 5, 20 and 100)."""
    ks = []
    for run in runs:
        ks += [k for k in run.report_ks or [] if k not in ks]
    return ks or list(DEFAULT_REPORT_KS)


def read_runs(paths: Iterable[str | os.PathLike]) -> list[RunResult]:
    """The runs of `find_results(paths)`. Runs of one system on one dataset are its seeds: two with
    the same seed (or two without one) are an error."""
    runs = [read_run(p) for p in find_results(paths)]
    check_distinct(runs)
    return runs


def check_distinct(runs: Sequence[RunResult]) -> None:
    seen: dict[tuple[str, str, int | None], RunResult] = {}
    for run in runs:
        other = seen.setdefault((run.system, run.dataset, run.seed), run)
        if other is not run:
            seed = "" if run.seed is None else f" with seed {run.seed}"
            raise ValueError(f"two runs of {run.system!r} on {run.dataset!r}{seed}: {other.path} and {run.path}; "
                             "give one of them another name (evaluate.py name=...)")


def check_beir_metrics(names: Sequence[str]) -> None:
    unknown = [m for m in names if m not in BEIR_METRICS]
    if unknown:
        raise ValueError(f"unknown BEIR metric(s) {unknown}; expected some of {', '.join(BEIR_METRICS)}")
