"""What the report's tables and curves share: how numbers and columns are written, and a system's
runs over seeds as one mean run (`taser.evaluation.report`, `difference_tables`, `curves`)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from taser.evaluation.runs import BEIR_METRICS, RunResult

SIGNIFICANT = "†"


def _in_order(values: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(values))


def _fmt_params(n: int | None) -> str:
    return "–" if n is None else f"{n / 1e6:.1f}M"


def _columns(runs: Sequence[RunResult], ks: Sequence[int | str], beir_metrics: Sequence[str]) -> list[tuple[str, str, str]]:
    """(dataset, metric, header) of each metric column, datasets in order of first appearance; a
    dataset with reader runs has EM@k then F1@k columns after its top-k ones (the reader rows fill all three)."""
    kinds: dict[str, set[str]] = {}
    for run in runs:
        kinds.setdefault(run.dataset, set()).add(run.task)
    columns = []
    for dataset, tasks in kinds.items():
        metrics = list(beir_metrics) if tasks == {"beir"} else [f"top-{k}" for k in ks]
        if "reader" in tasks:
            metrics += [f"EM@{k}" for k in ks] + [f"F1@{k}" for k in ks]
        columns += [(dataset, m, f"{dataset} {m}") for m in metrics]
    return columns


def _number(value: float, metric: str) -> str:
    """BEIR's metrics are fractions (3 decimals); top-k, EM and F1 are percentages (1 decimal)."""
    return f"{value:.3f}" if metric in BEIR_METRICS else f"{value:.1f}"


def _signed(value: float, metric: str) -> str:
    return ("+" if value >= 0 else "−") + _number(abs(value), metric)


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
