"""The seed checks beside the paired test: seeds of one system tested against each other, and each
system's difference from the baseline seed by seed, on runs whose outcomes are known by hand."""

import pytest

from taser.evaluation.comparison import StatsSettings
from taser.evaluation.report import report_markdown, seed_checks_markdown
from taser.evaluation.runs import RunResult
from taser.evaluation.seed_checks import seed_against_seed, seed_by_seed
from taser.evaluation.significance import smallest_p

N = 40


def run(system, seed, ranks, reverse=False):
    """A QA run; `reverse`: its per-query lines in the opposite order (the same questions)."""
    hits = {k: 100.0 * sum(r is not None and r <= k for r in ranks) / len(ranks) for k in (1, 5)}
    records = [{"id": str(i), "rank": r} for i, r in enumerate(ranks)]
    return RunResult(system, "SQuAD", top_k={str(k): v for k, v in hits.items()}, seed=seed, per_query=records[::-1] if reverse else records)


@pytest.fixture
def runs():
    return [
        run("dpr", 1, [1] * N),  # seeds that disagree on every question at top-1
        run("dpr", 2, [2] * N),
        run("dpr", 3, [1] * (N // 2) + [2] * (N // 2), reverse=True),
        run("taser", 1, [1] * N),  # seeds that agree on every question
        run("taser", 2, [1] * N),
        run("taser", 4, [1] * (N // 4) + [None] * (3 * N // 4)),  # a seed dpr was not trained with
        RunResult("BM25", "SQuAD", top_k={"1": 50.0, "5": 100.0}, per_query=[{"id": str(i), "rank": 1 + i % 2} for i in range(N)]),
    ]


def test_seed_against_seed_on_hand_computable_pairs(runs):
    settings = StatsSettings(resamples=999)
    pairs = {(p.system, p.seeds, p.metric): p for p in seed_against_seed(runs, [("SQuAD", "top-1"), ("SQuAD", "top-5")], settings)}
    assert len(pairs) == 2 * (3 + 3)  # each seeded system's 3 pairs of seeds, on 2 metrics; BM25 has no seed
    every = pairs[("dpr", (1, 2), "top-1")]
    assert every.delta == pytest.approx(100.0) and every.p == pytest.approx(smallest_p(N))  # wins on every question: 2 / 2**N, exact
    half = pairs[("dpr", (1, 3), "top-1")]  # seed 3's lines are in the opposite order: matched by id, it wins on the first half
    assert half.delta == pytest.approx(50.0) and half.p == pytest.approx(smallest_p(N // 2))  # wins half, ties the rest: 2 / 2**(N/2)
    assert pairs[("dpr", (2, 3), "top-1")].delta == pytest.approx(-50.0)
    same = pairs[("taser", (1, 2), "top-1")]
    assert same.delta == 0.0 and same.p == 1.0  # identical outcomes
    assert pairs[("dpr", (1, 2), "top-5")].p == 1.0  # every rank within 5 for both seeds
    assert pairs[("taser", (2, 4), "top-1")].delta == pytest.approx(75.0)


def test_seed_against_seed_leaves_out_what_a_run_lacks(runs):
    no_outcomes = RunResult("dpr", "SQuAD", top_k={"1": 10.0, "5": 20.0}, seed=5)  # no per_query.jsonl
    readers = [RunResult("reader", "SQuAD", task="reader", top_k={"1": 100.0}, metrics={"EM@1": 100.0 * (seed - 1)}, seed=seed,
                         per_query=[{"id": str(i), "rank": 1, "EM@1": 100.0 * (seed - 1)} for i in range(N)]) for seed in (1, 2)]
    pairs = seed_against_seed([*runs, no_outcomes, *readers], [("SQuAD", "top-1"), ("SQuAD", "EM@1")], StatsSettings(resamples=99))
    assert len(pairs) == 3 + 3 + 2 and all(5 not in p.seeds for p in pairs)
    assert {(p.system, p.metric) for p in pairs} == {("dpr", "top-1"), ("taser", "top-1"), ("reader", "top-1"), ("reader", "EM@1")}  # no retriever's EM@1
    assert next(p for p in pairs if p.metric == "EM@1").delta == -100.0


def test_seed_by_seed_pairs_runs_at_the_same_seed(runs):
    diffs = seed_by_seed(runs, [("SQuAD", "top-1")], baseline="dpr")
    assert set(diffs) == {("taser", "SQuAD", "top-1")}  # not the baseline, not the seedless BM25
    assert diffs[("taser", "SQuAD", "top-1")] == [(1, 0.0), (2, 100.0)]  # seed 4 has no dpr to pair with
    assert seed_by_seed(runs, [("SQuAD", "top-1")], baseline="BM25") == {}  # a seedless baseline shares no seed


def test_report_sections(runs):
    settings = StatsSettings(baseline="dpr", resamples=999, bootstrap=False)
    text = report_markdown(runs, {}, ks=(1,), stats=settings)
    by_seed = text.split("## Against dpr, seed by seed")[1].split("## Seed against seed")[0]
    assert "| taser | 1: +0.0, 2: +100.0 |" in by_seed and "A check, not a test" in by_seed
    checks = text.split("## Seed against seed")[1]
    assert "| dpr | 3 of 3 (largest Δ 100.0) |" in checks  # seeds 1-2, 1-3 and 2-3 each differ on 20-40 of 40 questions
    assert "| taser | 2 of 3 (largest Δ 75.0) |" in checks  # the largest in absolute value: seed 2 minus seed 4 is +75, 1 minus 4 too
    only_negative = [run("x", 1, [2] * N), run("x", 2, [1] * N)]
    assert "| x | 1 of 1 (largest Δ 100.0) |" in seed_checks_markdown(only_negative, StatsSettings(resamples=99), ks=(1,))
    assert "In all 5 of 6 such tests reject" in checks
    assert "BM25" not in checks
    # one caller writing several tables puts the section once
    assert "## Seed against seed" not in report_markdown(runs, {}, ks=(1,), stats=settings, seed_checks=False)
    assert seed_checks_markdown([r for r in runs if r.system == "BM25"]) == ""
