"""Top-k accuracy curves (k = 1..100), one PNG per dataset (matplotlib, Agg backend: no display
needed): each system's mean over its seeds, the spread over seeds shaded."""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Sequence
from pathlib import Path

from taser.evaluation.runs import RunResult
from taser.io import atomic_path

log = logging.getLogger(__name__)


def plot_file_name(dataset: str) -> str:
    return "topk-" + (re.sub(r"[^A-Za-z0-9._-]+", "-", dataset).strip("-") or "dataset") + ".png"


def k_axis(ax, k_max: int) -> None:
    """k on a log scale, ticks at the cut-offs papers report: on a linear axis k = 1-20, where the
    systems differ, would take a fifth of the width of a curve to 100."""
    from matplotlib.ticker import NullFormatter

    ax.set_xscale("log")
    ticks = [k for k in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000) if k <= k_max]
    ax.set_xticks(ticks, [str(k) for k in ticks])
    ax.set_xlim(1, k_max)  # after the ticks, which would widen the view to the last of them
    ax.xaxis.set_minor_formatter(NullFormatter())


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
        colours = plt.get_cmap("tab20").colors if len(groups) > 10 else [None] * len(groups)  # tab10 repeats after 10 systems
        for (system, curves), colour in zip(groups.items(), colours):
            length = min(len(c) for c in curves)
            ks = range(1, length + 1)
            mean = [sum(c[i] for c in curves) / len(curves) for i in range(length)]
            label = system if len(curves) == 1 else f"{system} (mean of {len(curves)} seeds)"
            (line,) = ax.plot(ks, mean, label=label, linewidth=1.6, color=colour)
            if len(curves) > 1:  # the spread over seeds: shaded from the lowest to the highest run at each k
                ax.fill_between(ks, [min(c[i] for c in curves) for i in range(length)], [max(c[i] for c in curves) for i in range(length)],
                                color=line.get_color(), alpha=0.2, linewidth=0)
                spread = True
        ax.set_xlabel("k (passages retrieved)")
        ax.set_ylabel("queries with a relevant passage in the top k (%)" if task == "beir" else
                      "top-k accuracy (%)" + (", macro average" if task == "entity_questions" else ""))
        ax.set_title(f"{dataset}: top-k accuracy" + (" (shaded: min-max over seeds)" if spread else ""))
        k_axis(ax, max(len(r.curve) for r in mine))
        ax.grid(True, alpha=0.3)
        ax.legend(loc="lower right", fontsize=8)
        fig.tight_layout()
        path = Path(path)
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format="png")
    finally:
        plt.close(fig)
    return path
