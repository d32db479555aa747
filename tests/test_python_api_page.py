"""docs/python.md's example runs as printed: its ```python blocks, in order and in one namespace, from a
directory laid out like the repository root (the shipped data/; outputs/ written there), with the
shipped MiniLM. What it prints must have the shape of the page's ```text block, and figures near it."""

from __future__ import annotations

import re

import pytest
from conftest import ROOT

PAGE = ROOT / "docs" / "python.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
TOPK = re.compile(r"top-(\d+) (\d+\.\d)")

pytestmark = pytest.mark.slow


def fenced(text: str, language: str) -> list[tuple[int, str]]:
    """(first line number, code) of each fenced block in `language`."""
    return [(text.count("\n", 0, m.start(2)) + 1, m.group(2)) for m in FENCE.finditer(text) if m.group(1) == language]


def test_the_page_has_an_example_and_its_output():
    text = PAGE.read_text(encoding="utf-8")
    assert fenced(text, "python"), "docs/python.md has no ```python block"
    assert len(fenced(text, "text")) == 1, "docs/python.md shows the example's output in one ```text block"


def test_python_api_example_runs(tmp_path, monkeypatch, capsys):
    text = PAGE.read_text(encoding="utf-8")
    (tmp_path / "data").symlink_to(ROOT / "data", target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__main__"}
    for line, code in fenced(text, "python"):
        # padded so that a failure's traceback names the page's own line
        exec(compile("\n" * (line - 1) + code, str(PAGE), "exec"), namespace)
    printed = capsys.readouterr().out.strip().splitlines()
    shown = fenced(text, "text")[0][1].strip().splitlines()

    assert (tmp_path / "outputs" / "python-api" / "minilm" / "config.json").is_file(), "the example saves its checkpoint under outputs/"
    assert len(printed) == len(shown), f"printed {printed}, the page shows {shown}"
    assert printed[0] == shown[0], "the corpus and question counts are deterministic: the page must show them as printed"
    got, documented = ({int(k): float(v) for k, v in TOPK.findall(lines[1])} for lines in (printed, shown))
    assert got.keys() == documented.keys() == {1, 5, 20}, (printed[1], shown[1])
    assert got[1] <= got[5] <= got[20]
    for k in got:  # CPUs differ (bf16 or fp32 encoding): a few questions either way, not a different result
        assert abs(got[k] - documented[k]) <= 10, f"top-{k}: printed {got[k]}, the page shows {documented[k]}"
