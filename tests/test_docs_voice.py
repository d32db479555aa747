"""The docs speak to a researcher using the library: no page names the project's issues, design notes
or shared folders, dates stay on the benchmarks page, and the README's first screen is what it is, the
two commands, a first minute and where to go."""

from __future__ import annotations

import re

import pytest
from conftest import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_page_speaks_of_the_projects_own_process(page):
    text = page.read_text(encoding="utf-8")
    for pattern in (r"\bissues? #?\d+", r"design notes?", r"DESIGN\.md", r"\.\./shared", r"\bthis session\b"):
        found = re.search(pattern, text, re.IGNORECASE)
        assert found is None, f"{page.name}: {found.group(0)!r} speaks of the project's history, not of the library"


@pytest.mark.parametrize("page", [p for p in PAGES if p.name != "benchmarks.md"], ids=lambda p: p.name)
def test_dates_stay_on_the_benchmarks_page(page):
    found = re.search(r"\b20\d\d-[01]\d-[0-3]\d\b", page.read_text(encoding="utf-8"))
    assert found is None, f"{page.name}: a date ({found.group(0)}) in the running text; it belongs with its figure in benchmarks/"


def test_the_readmes_first_screen():
    headings = re.findall(r"^## (.+)$", (ROOT / "README.md").read_text(encoding="utf-8"), re.MULTILINE)
    assert headings[:3] == ["The two commands", "A first minute", "Where to go"]
