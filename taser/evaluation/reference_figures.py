"""The papers' figures the table presets carry (`reference_figures.yaml` beside this module): one entry
per row of a paper's table, with its source. A preset row names its entry (`cites`) and carries exactly
its figures (`reference`); `check_row_reference` holds the two together."""

from __future__ import annotations

from functools import cache
from pathlib import Path

FIGURES_FILE = Path(__file__).with_name("reference_figures.yaml")
NOT_FIGURES = ("source", "approximate")


@cache
def _entries() -> dict[str, dict]:
    import yaml

    return yaml.safe_load(FIGURES_FILE.read_text())


def reference_entry(key: str) -> dict:
    """The entry `key` of the reference file (its source, figures, and whether they are approximate)."""
    entries = _entries()
    if key not in entries:
        near = [k for k in entries if k.rsplit(".", 1)[0] == key.rsplit(".", 1)[0]] or sorted(entries)[:8]
        raise ValueError(f"{key!r} is not an entry of {FIGURES_FILE.name}; entries near it: {', '.join(near)}")
    return entries[key]


def reference_figures(key: str) -> dict[str, float]:
    """The figures of entry `key`, by metric."""
    return {k: v for k, v in reference_entry(key).items() if k not in NOT_FIGURES}


def check_row_reference(where: str, cites: str | None, reference: dict) -> None:
    """A row's figures are those of the entry it cites: all of them, none other; a row with figures cites one."""
    if cites is None:
        if reference:
            raise ValueError(f"{where}: reference {reference} names no source: set cites to its entry of {FIGURES_FILE.name}")
        return
    recorded = reference_figures(cites)
    if {k: float(v) for k, v in reference.items()} != {k: float(v) for k, v in recorded.items()}:
        raise ValueError(f"{where}: reference {dict(reference)} differs from {cites} in {FIGURES_FILE.name}: {recorded}")
