"""The hand-written section of `benchmarks/ablations/results.md` quotes the generated tables above
it: every figure in its claims about machines, recipes, seeds and time (its opening, "Supported",
"Not shown", "How many seeds", "Time") is a cell of those tables, so a regeneration that moves a
figure fails here until the text is rewritten from the new numbers."""

from __future__ import annotations

import re

from conftest import ROOT

RESULTS = ROOT / "benchmarks" / "ablations" / "results.md"
HAND_WRITTEN = "## What the study supports"
# a figure: a decimal, or a p-value in scientific notation; signs and unicode minus dropped
FIGURE = re.compile(r"(?<![\w.])[+\-−]?(\d+\.\d+(?:e[-+]?\d+)?|\d+e[-+]?\d+)(?![\w.])")


def _canonical(figure: str) -> str:
    mantissa, e, exponent = figure.partition("e")
    return f"{mantissa}e{int(exponent)}" if e else figure  # 2.5e-06 as 2.5e-6


def figures(text: str) -> set[str]:
    return {_canonical(m.group(1)) for m in FIGURE.finditer(text.replace("`", " "))}


def claims(hand_written: str) -> str:
    """The paragraphs about machines, recipes, seeds and time: the whole section but the old tables'
    claims (which quote those tables, not these)."""
    start = hand_written.index("**What the old single-seed tables claimed")
    return hand_written[:start] + hand_written[hand_written.index("**Time", start):]


def test_every_figure_the_claims_quote_is_a_generated_cell():
    text = RESULTS.read_text(encoding="utf-8")
    generated, _, hand_written = text.partition(HAND_WRITTEN)
    assert hand_written, f"{RESULTS.name} has no {HAND_WRITTEN!r} section"
    quoted = figures(claims(hand_written))
    assert len(quoted) > 20  # the section does quote figures: the test is not vacuous
    missing = sorted(quoted - figures(generated))
    assert not missing, f"figures in {RESULTS.name}'s {HAND_WRITTEN!r} that no generated table holds (rewrite them from the tables): {missing}"


def test_a_stale_figure_is_noticed():
    text = RESULTS.read_text(encoding="utf-8")
    generated, _, hand_written = text.partition(HAND_WRITTEN)
    stale = claims(hand_written) + " (recipe p = 0.123456)"
    assert "0.123456" in figures(stale) - figures(generated)
