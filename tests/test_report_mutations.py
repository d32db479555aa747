"""The report's statistics on cases whose answers are known exactly, each built so that one
plausible mistake changes the answer: Holm's correction (adjusted p, marks, printed p), seeds
averaged question by question, two runs paired by question id, the bootstrap (paired, weighted,
at the confidence asked, reused only when drawn alike), and per-query records paired with the
right ids (QA files, EntityQuestions, BEIR)."""

import itertools
import json

import numpy as np
import pytest
from scipy.stats import binom

from taser.data.qa import read_qa
from taser.evaluation.comparison import StatsSettings, compare, outcomes
from taser.evaluation.per_query import PER_QUERY_FILE, metric_values, question_weights, read_per_query
from taser.evaluation.report import differences_table, markdown_table, report_markdown
from taser.evaluation.runs import RunResult
from taser.evaluation.seeds import Outcomes
from taser.evaluation.significance import bootstrap_interval


def _run(system, ranks: dict, seed=None, dataset="D", relations: dict | None = None) -> RunResult:
    """A QA run whose per-query records are `ranks` ({id: first-hit rank or None}) in the dict's
    order, with the top-1 and top-5 figures its results.json would hold (macro over `relations`)."""
    records = [{"id": i, **({"relation": relations[i]} if relations else {}), "rank": r} for i, r in ranks.items()]
    w = question_weights(records)
    top_k = {str(k): float(np.sum(w * metric_values(records, f"top-{k}"))) for k in (1, 5)}
    return RunResult(system, dataset, "entity_questions" if relations else "qa", top_k=top_k, seed=seed,
                     path=f"{system}/seed-{seed}/results.json", per_query=records)


def _exact_p(diffs, weights=None) -> float:
    """The two-sided sign-flip p-value by enumerating every flip (independent of scipy)."""
    d = np.asarray(diffs, dtype=float)
    w = np.full(len(d), 1 / len(d)) if weights is None else np.asarray(weights, dtype=float)
    observed = abs(np.sum(w * d))
    flips = [abs(np.sum(w * d * np.array(s))) for s in itertools.product((1, -1), repeat=len(d))]
    return sum(f >= observed - 1e-9 for f in flips) / len(flips)


def _rows(table: str) -> dict[str, list[str]]:
    return {line.strip("|").split("|")[0].strip(): [c.strip() for c in line.strip("|").split("|")[1:]]
            for line in table.splitlines() if line.startswith("| ") and "---" not in line}


# -- 1. Holm's correction ------------------------------------------------------------------
IDS = [f"q{i}" for i in range(10)]


def _hits(which: set) -> dict:
    return {q: (1 if q in which else None) for q in IDS}


@pytest.fixture
def holm_runs():
    """Baseline B hits q9 only. A hits all 10 (9 wins, 1 tie): exact p = 2/2^9. C hits q0-q5 and q9
    (6 wins): p = 2/2^6. D hits q0-q6 (7 wins, 1 loss on q9, 2 ties): p = 18/256."""
    return [_run("B", _hits({"q9"})), _run("A", _hits(set(IDS))), _run("C", _hits({"q0", "q1", "q2", "q3", "q4", "q5", "q9"})),
            _run("D", _hits({"q0", "q1", "q2", "q3", "q4", "q5", "q6"}))]


def test_holm_adjusts_the_p_values_marks_and_printed_p(holm_runs):
    """Would catch `compare` without Holm's correction (the adjusted p set to the raw p), † decided
    from the raw p, or the differences table printing the raw p as the adjusted one."""
    settings = StatsSettings(baseline="B", bootstrap=False, resamples=10_000)  # 2^10 <= 10,000: every flip enumerated
    comparison = compare(holm_runs, [("D", "top-1")], settings)
    raw = {s: comparison.cells[(s, "D", "top-1")].p for s in "ACD"}
    assert raw == pytest.approx({"A": 2 / 2**9, "C": 2 / 2**6, "D": 18 / 256})
    assert raw["D"] == pytest.approx(_exact_p([100] * 7 + [0, 0, -100]))
    # Holm over 3: 3 x 2/512 = 0.01171875; 2 x 2/64 = 0.0625; 1 x 18/256 = 0.0703125 (already monotone)
    adjusted = {s: comparison.cells[(s, "D", "top-1")].p_holm for s in "ACD"}
    assert adjusted == pytest.approx({"A": 0.01171875, "C": 0.0625, "D": 0.0703125})
    assert comparison.tests == 3
    # C differs at p < 0.05 before the correction, not after it: no mark
    assert {s: comparison.cells[(s, "D", "top-1")].significant for s in "ACD"} == {"A": True, "C": False, "D": False}
    assert {s: comparison.cells[(s, "D", "top-1")].delta for s in "ACD"} == pytest.approx({"A": 90.0, "C": 60.0, "D": 60.0})
    main = _rows(markdown_table(holm_runs, ks=(1,), comparison=comparison))
    assert {s: main[s][0] for s in "BACD"} == {"B": "10.0", "A": "100.0 †", "C": "70.0", "D": "70.0"}
    diffs = _rows(differences_table(holm_runs, comparison, ks=(1,)))
    assert diffs["A"] == ["+90.0 (p=0.012) †"] and diffs["C"] == ["+60.0 (p=0.062)"] and diffs["D"] == ["+60.0 (p=0.07)"]
    text = report_markdown(holm_runs, {}, ks=(1,), comparison=comparison)
    assert "after Holm's correction over the table's 3 comparison(s)" in text and "p: Holm-adjusted" in text


# -- 2. seeds averaged question by question ---------------------------------------------
def _seeded():
    """S: seed 1 (ids a..e) hits a, b, e at rank 1 and d at 3; seed 2 (ids in reverse) hits b-e at
    rank 1. Top-1 averaged over seeds, by id: a 50, b 100, c 50, d 50, e 100. Baseline B (its own
    order) hits only b."""
    s1 = _run("S", {"a": 1, "b": 1, "c": None, "d": 3, "e": 1}, seed=1)
    s2 = _run("S", {"e": 1, "d": 1, "c": 1, "b": 1, "a": None}, seed=2)
    base = _run("B", {"c": None, "a": None, "e": None, "b": 1, "d": None})
    return s1, s2, base


def test_a_systems_outcomes_are_averaged_over_its_seeds():
    """Would catch `comparison.outcomes` taking the first seed only (or any one seed) instead of
    averaging the seeds question by question."""
    s1, s2, base = _seeded()
    averaged = outcomes([s1, s2], "top-1")
    assert averaged.ids == ("a", "b", "c", "d", "e") and averaged.runs == 2
    assert averaged.values.tolist() == [50.0, 100.0, 50.0, 50.0, 100.0]
    assert outcomes([s2, s1], "top-1").aligned(averaged.ids).tolist() == averaged.values.tolist()  # whichever seed comes first
    comparison = compare([s1, s2, base], [("D", "top-1")], StatsSettings(baseline="B", bootstrap=False))
    cell = comparison.cells[("S", "D", "top-1")]
    assert cell.spread.n == 2 and cell.spread.mean == pytest.approx(70.0)  # results.json's 60 and 80
    # differences by id: 50, 0, 50, 50, 100 -> delta 50; only the all-same-sign flips reach 250 of 250: p = 2/16
    assert cell.delta == pytest.approx(50.0)  # the first seed alone: 40
    assert cell.p == pytest.approx(2 / 16) == pytest.approx(_exact_p([50, 0, 50, 50, 100]))  # the first seed alone: 0.5


# -- 3. two runs paired by question id -------------------------------------------------
def test_outcomes_are_paired_by_id_not_by_position():
    """Would catch `Outcomes.aligned` pairing two runs' per-question outcomes by position instead of by id."""
    o = Outcomes(("a", "b", "c"), np.array([1.0, 2.0, 3.0]), np.full(3, 1 / 3), 1)
    assert o.aligned(("c", "a", "b")).tolist() == [3.0, 1.0, 2.0]
    assert o.aligned(("a", "b", "c")).tolist() == [1.0, 2.0, 3.0]
    # X (ids a..f) hits a-e; the baseline (ids f..a) hits only a. By id the differences are 0, +100 x 4, 0:
    # p = 2/16; paired by position they would be +100 x 5, -100: p = 14/64
    x = _run("X", {q: (None if q == "f" else 1) for q in "abcdef"})
    base = _run("B", {q: (1 if q == "a" else None) for q in "fedcba"})
    comparison = compare([base, x], [("D", "top-1")], StatsSettings(baseline="B", bootstrap=False))
    cell = comparison.cells[("X", "D", "top-1")]
    assert cell.p == pytest.approx(2 / 16) == pytest.approx(_exact_p([0, 100, 100, 100, 100, 0]))
    assert cell.delta == pytest.approx(400 / 6)
    # with unequal weights (EntityQuestions' macro average) the difference itself depends on the pairing
    relations = {"a": "P1", "b": "P2", "c": "P2", "d": "P2", "e": "P2", "f": "P2"}  # a: weight 1/2, the others 1/10
    xw = _run("X", {q: (None if q == "f" else 1) for q in "abcdef"}, relations=relations)
    bw = _run("B", {q: (1 if q == "a" else None) for q in "fedcba"}, relations=relations)
    weighted = compare([bw, xw], [("D", "top-1")], StatsSettings(baseline="B", bootstrap=False)).cells[("X", "D", "top-1")]
    assert weighted.delta == pytest.approx(4 * 100 / 10)  # a is a tie; b-e win, each 1/10
    assert weighted.p == pytest.approx(_exact_p([0, 100, 100, 100, 100, 0], [0.5, 0.1, 0.1, 0.1, 0.1, 0.1]))


# -- 4. the bootstrap: paired, weighted, at the confidence asked --------------------------
def _binary_case(n: int = 200, hits: int = 40):
    """`hits` questions at 100 weighing 1/(2 hits) each, the others at 0 weighing 1/(2 (n - hits)): the
    weighted mean is 50 (unweighted: 100 hits / n). A resample with k hits has the weighted mean
    f(k) = 100 k a / (k a + (n - k) b), monotone in k, and k ~ Binomial(n, hits / n): the percentile
    interval's ends are f at the binomial quantiles."""
    a, b = 1 / (2 * hits), 1 / (2 * (n - hits))
    values = np.array([100.0] * hits + [0.0] * (n - hits))
    weights = np.array([a] * hits + [b] * (n - hits))

    def expected(confidence):
        tail = (1 - confidence) / 2
        return tuple(100 * k * a / (k * a + (n - k) * b) for k in binom.ppf([tail, 1 - tail], n, hits / n))

    return values, weights, expected


def test_the_bootstrap_resamples_weighted_pairs_at_the_confidence_asked():
    """Would catch the bootstrap drawn unpaired (values and weights resampled apart), without the
    per-question weights (an interval around the unweighted 20 instead of the weighted 50), or at a
    fixed 95% whatever `confidence` says."""
    values, weights, expected = _binary_case()
    step = 1.0  # f changes by about 0.8 per hit near k = 40: the finite resampling may land a hit or so away
    wide = bootstrap_interval(values, weights, 0.95, 10_000, seed=0)
    narrow = bootstrap_interval(values, weights, 0.5, 10_000, seed=0)
    assert wide == pytest.approx(expected(0.95), abs=2 * step)  # about (39.7, 60.4)
    assert narrow == pytest.approx(expected(0.5), abs=2 * step)  # about (46.4, 53.4)
    assert wide[0] < narrow[0] < 50 < narrow[1] < wide[1]
    # the same values, equal weights: around 20
    plain = bootstrap_interval(values, None, 0.95, 10_000, seed=0)
    assert plain == pytest.approx(tuple(100 * k / 200 for k in binom.ppf([0.025, 0.975], 200, 0.2)), abs=1.0)


def _eq_runs(system: str, hit_first: int, hit_second: int, order: int = 1):
    """EntityQuestions-like: relation P1 with 40 questions, P2 with 160; `hit_*` of each at rank 1."""
    ids = [f"P1:{i}" for i in range(40)] + [f"P2:{i}" for i in range(160)]
    ranks = {q: (1 if (q.startswith("P1") and int(q[3:]) < hit_first) or (q.startswith("P2") and int(q[3:]) < hit_second) else None)
             for q in ids[::order]}
    return _run(system, ranks, relations={q: q.split(":")[0] for q in ids})


def test_the_reports_intervals_weigh_questions_and_follow_the_confidence():
    """Would catch `compare` drawing the interval without the questions' weights (EntityQuestions'
    macro average), at a fixed confidence, or reusing another comparison's intervals drawn at
    another confidence."""
    # M: P1 all hit (100), P2 none: macro 50 (micro 20), as `_binary_case`; N: the reverse, macro 50 too (micro 80)
    m, other = _eq_runs("M", 40, 0), _eq_runs("N", 0, 160, order=-1)
    runs = [m, other]
    _, _, expected = _binary_case()
    wide = compare(runs, [("D", "top-1")], StatsSettings(baseline="N", resamples=5000, confidence=0.95))
    narrow = compare(runs, [("D", "top-1")], StatsSettings(baseline="N", resamples=5000, confidence=0.5))
    assert wide.cells[("M", "D", "top-1")].spread.mean == pytest.approx(50.0)
    assert wide.cells[("M", "D", "top-1")].interval == pytest.approx(expected(0.95), abs=2.0)
    assert narrow.cells[("M", "D", "top-1")].interval == pytest.approx(expected(0.5), abs=2.0)
    assert wide.cells[("M", "D", "top-1")].delta == pytest.approx(0.0)  # macro 50 against macro 50
    # reuse: the other baseline's comparison at 95% is no source for intervals at 50%
    reused = compare(runs, [("D", "top-1")], StatsSettings(baseline="M", resamples=5000, confidence=0.5), reuse=wide)
    for key, cell in reused.cells.items():
        assert cell.interval == narrow.cells[key].interval != wide.cells[key].interval, key
    same = compare(runs, [("D", "top-1")], StatsSettings(baseline="M", resamples=5000, confidence=0.95), reuse=wide)
    assert {k: c.interval for k, c in same.cells.items()} == {k: c.interval for k, c in wide.cells.items()}
    text = report_markdown(runs, {}, ks=(1,), comparison=narrow)
    assert "50% percentile-bootstrap interval" in text


# -- 5. per-query records paired with the right ids ---------------------------------------
def test_qa_per_query_ranks_belong_to_their_questions(mini_squad, tmp_path):
    """Would catch per-query records whose ranks are paired with the wrong ids (QA file): each
    question's rank is checked against its own record of the retrieval JSON."""
    from taser.pipeline.evaluate import evaluate_bm25

    out = tmp_path / "bm25"
    results = evaluate_bm25(mini_squad / "dev.qa.tsv", mini_squad / "passages.tsv", out,
                            bm25={"backend": "bm25s", "index_dir": str(tmp_path / "idx")})
    records = read_per_query(out / PER_QUERY_FILE)
    retrieval = json.loads((out / "retrieval.json").read_text())
    questions = [q.question for q in read_qa(mini_squad / "dev.qa.tsv")]
    assert len(records) == len(retrieval) == results["questions"]
    ranks = [r["rank"] for r in records]
    assert len(set(ranks)) >= 3  # the check below tells a shuffle from the truth
    for record in records:
        i = int(record["id"])
        mine = retrieval[i]
        assert mine["question"] == questions[i]
        expected = next((j + 1 for j, c in enumerate(mine["ctxs"]) if c["has_answer"]), None)
        assert record["rank"] == expected, record


def test_entity_questions_per_query_ranks_belong_to_their_questions(tmp_path):
    """Would catch EntityQuestions' per-query records paired with the wrong ids: each id
    `<relation>:<i>` against record i of that relation's retrieval JSON."""
    from conftest import FIXTURES

    from taser.pipeline.evaluate import RetrieverSettings
    from taser.pipeline.evaluate_ood import evaluate_entity_questions
    from taser.retrieval.bm25 import BM25Settings

    out = tmp_path / "eq"
    settings = RetrieverSettings("bm25", bm25=BM25Settings(backend="bm25s", index_dir=str(tmp_path / "bm25")))
    evaluate_entity_questions(settings, FIXTURES / "entity-questions-tiny" / "test", FIXTURES / "entity-questions-tiny" / "passages.tsv", out)
    records = read_per_query(out / PER_QUERY_FILE)
    for record in records:
        relation, i = record["id"].split(":")
        assert record["relation"] == relation
        mine = json.loads((out / "retrieval" / f"{relation}.test.json").read_text())[int(i)]
        assert record["rank"] == next((j + 1 for j, c in enumerate(mine["ctxs"]) if c["has_answer"]), None), record


def _trec_ranked(run_file) -> dict[str, list[str]]:
    """Each query's documents as trec_eval ranks them: by decreasing score, ties by decreasing doc id."""
    hits: dict[str, list[tuple[float, str]]] = {}
    for line in run_file.read_text().splitlines():
        qid, _, doc, _, score, _ = line.split()
        hits.setdefault(qid, []).append((float(score), doc))
    return {q: [d for _, d in sorted(h, key=lambda x: (-x[0], _desc(x[1])))] for q, h in hits.items()}


def _desc(doc: str):
    return tuple(-ord(c) for c in doc) + (0,)  # decreasing doc id (a prefix sorts after its extensions)


def _beir_dir(root):
    """A BEIR dataset whose queries score apart: query i's word is in its relevant document once
    and in i unjudged distractors three times (ranked above it), and i more relevant documents never
    retrieved: MRR@10 1/(i + 1), Recall 1/(i + 1), each nDCG its own."""
    words = ["kiwi", "mango", "peach", "plum", "lime"]
    corpus, queries, qrels = [], [], ["query-id\tcorpus-id\tscore"]
    for i, word in enumerate(words):
        queries.append({"_id": f"q{i}", "text": f"{word} question", "metadata": {}})
        corpus.append({"_id": f"rel{i}", "title": "", "text": f"{word} is a fruit of note {i}", "metadata": {}})
        qrels.append(f"q{i}\trel{i}\t{1 + i % 2}")
        for j in range(i):
            corpus.append({"_id": f"dis{i}x{j}", "title": "", "text": f"{word} {word} {word}", "metadata": {}})
            corpus.append({"_id": f"far{i}x{j}", "title": "", "text": f"unrelated text number {i} {j}", "metadata": {}})
            qrels.append(f"q{i}\tfar{i}x{j}\t1")
    (root / "qrels").mkdir(parents=True)
    (root / "corpus.jsonl").write_text("".join(json.dumps(c) + "\n" for c in corpus))
    (root / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    (root / "qrels" / "test.tsv").write_text("\n".join(qrels) + "\n")
    return root


def test_beir_per_query_values_belong_to_their_queries(tmp_path):
    """Would catch BEIR per-query records whose ids are shuffled against their scores: each query's
    MRR@10, Recall@k and nDCG@k recomputed by hand from run.trec and the qrels."""
    from taser.pipeline.evaluate import RetrieverSettings
    from taser.pipeline.evaluate_ood import evaluate_beir
    from taser.retrieval.bm25 import BM25Settings

    data = _beir_dir(tmp_path / "beir-data")
    out = tmp_path / "beir"
    evaluate_beir(RetrieverSettings("bm25", bm25=BM25Settings(backend="bm25s")), data, out, work_dir=tmp_path / "work")
    qrels: dict[str, dict[str, int]] = {}
    for line in (data / "qrels" / "test.tsv").read_text().splitlines()[1:]:
        q, d, g = line.split("\t")
        qrels.setdefault(q, {})[d] = int(g)
    ranked = _trec_ranked(out / "run.trec")
    records = read_per_query(out / PER_QUERY_FILE)
    assert [r["id"] for r in records] == [q for q in qrels if q in ranked]  # the qrels' order
    assert len({r["MRR@10"] for r in records}) == len({r["nDCG@10"] for r in records}) == len(records) == 5  # any shuffle shows
    for record in records:
        docs, judged = ranked[record["id"]], qrels[record["id"]]
        relevant = {d for d, g in judged.items() if g > 0}
        first = next((i + 1 for i, d in enumerate(docs) if d in relevant), None)
        assert record["MRR@10"] == pytest.approx(1 / first if first is not None and first <= 10 else 0.0, abs=1e-6), record
        for k in (10, 100):
            found = len(relevant & set(docs[:k]))
            assert record[f"Recall@{k}"] == pytest.approx(found / len(relevant) if relevant else 0.0, abs=1e-6), record
            dcg = sum(judged.get(d, 0) / np.log2(i + 2) for i, d in enumerate(docs[:k]))
            ideal = sum(g / np.log2(i + 2) for i, g in enumerate(sorted((g for g in judged.values() if g > 0), reverse=True)[:k]))
            assert record[f"nDCG@{k}"] == pytest.approx(dcg / ideal if ideal else 0.0, abs=1e-5), record


def test_one_family_over_two_tables_counts_a_shared_comparison_once(holm_runs):
    """Would catch a study's family that counts A-B twice (once per table), adjusts each table on its
    own, leaves the marks as each table decided them, or a note that still says "this table".
    Against B: A 2/512, C 2/64, D 18/256 (see `holm_runs`); against A: B is A-B again, C and D lose
    q6-q8 and q7-q9 (3 losses, no win): exact p = 2/8 each. Five distinct tests; Holm over five:
    2/512 x 5, 2/64 x 4, 18/256 x 3, 0.25 x 2 twice."""
    from taser.evaluation.comparison import one_family

    tables = {b: compare(holm_runs, [("D", "top-1")], StatsSettings(baseline=b, bootstrap=False, resamples=10_000)) for b in "BA"}
    assert tables["A"].cells[("C", "D", "top-1")].p == pytest.approx(2 / 8)
    assert tables["A"].cells[("C", "D", "top-1")].p_holm == pytest.approx(0.5)  # its own table: 2/8 x 2 (B-A 2/512 x 3 first)
    assert tables["B"].cells[("C", "D", "top-1")].significant is False and tables["B"].cells[("C", "D", "top-1")].p_holm == pytest.approx(0.0625)
    one_family(list(tables.values()), "the two tables")
    adjusted = {(b, s): tables[b].cells[(s, "D", "top-1")].p_holm for b, others in (("B", "ACD"), ("A", "BCD")) for s in others}
    assert adjusted == pytest.approx({("B", "A"): 5 * 2 / 512, ("B", "C"): 4 * 2 / 64, ("B", "D"): 3 * 18 / 256,
                                      ("A", "B"): 5 * 2 / 512, ("A", "C"): 0.5, ("A", "D"): 0.5})
    levels = {(b, s): tables[b].cells[(s, "D", "top-1")].runs_level for b, s in adjusted}
    # A-B is rejected at its step (2/512 <= 0.05/5); C's 2/64 fails 0.05/4, where Holm stops: every later comparison
    # (D's 18/256, the tied 0.25s) had to beat that same 0.05/4, not its own looser step
    assert levels == pytest.approx({("B", "A"): 0.01, ("B", "C"): 0.05 / 4, ("B", "D"): 0.05 / 4, ("A", "B"): 0.01,
                                    ("A", "C"): 0.05 / 4, ("A", "D"): 0.05 / 4})
    assert {k for k in adjusted if tables[k[0]].cells[(k[1], "D", "top-1")].significant} == {("B", "A"), ("A", "B")}
    assert all(t.family_sizes() == (5, 0) for t in tables.values())
    text = report_markdown(holm_runs, {}, ks=(1,), comparison=tables["B"])
    assert "after Holm's correction over the 5 distinct comparison(s) of the two tables (the family" in text
    assert "the family: this table" not in text
    assert _rows(differences_table(holm_runs, tables["B"], ks=(1,)))["C"] == ["+60.0 (p=0.12)"]
    # at alpha 0.015, A-B is marked in each table alone (3 x 2/512 = 0.0117) and not in the family (0.0195)
    strict = {b: compare(holm_runs, [("D", "top-1")], StatsSettings(baseline=b, alpha=0.015, bootstrap=False, resamples=10_000)) for b in "BA"}
    assert strict["B"].cells[("A", "D", "top-1")].significant and strict["A"].cells[("B", "D", "top-1")].significant
    one_family(list(strict.values()), "the two tables")
    assert not strict["B"].cells[("A", "D", "top-1")].significant and not strict["A"].cells[("B", "D", "top-1")].significant


def test_tables_against_several_baselines_are_one_family_unless_asked_per_table(holm_runs):
    """Would catch `tables_against` (what benchmarks/ablations/run.py reports with) ignoring its
    family setting, or drawing a table against a baseline the runs do not hold."""
    from taser.evaluation.report import tables_against

    study = tables_against(holm_runs, ["B", "missing", "A"], ks=(1,), bootstrap=False, resamples=10_000)
    assert list(study) == ["B", "A"]
    assert study["B"].cells[("C", "D", "top-1")].p_holm == pytest.approx(4 * 2 / 64) and study["B"].family_sizes() == (5, 0)
    apart = tables_against(holm_runs, ["B", "A"], ks=(1,), family="table", bootstrap=False, resamples=10_000)
    assert apart["B"].cells[("C", "D", "top-1")].p_holm == pytest.approx(2 * 2 / 64) and apart["B"].family is None
    with pytest.raises(ValueError, match="family"):
        tables_against(holm_runs, ["B"], ks=(1,), family="studies")


def _on(run: RunResult, machine: str | None) -> RunResult:
    run.machine = machine
    return run


def test_a_recipe_test_whose_sides_ran_on_different_machines_says_so(caplog):
    """Would catch the machine check comparing all seeds where the test pairs only the matched ones,
    missing a matched seed run on two machines, or missing seeds of one side on a machine the
    other side (a seedless reference) never ran on; the note under the table carries it."""
    from taser.evaluation.comparison import machines_unlike

    def seeds(system, machines, hits):
        return [_on(_run(system, _hits(set(IDS[:h])), seed=s), m) for s, m, h in zip((1, 2, 3), machines, hits)]

    a = seeds("A", ["X", "X", "Y"], [6, 7, 5])
    b = seeds("B", ["X", "X"], [4, 5])
    assert machines_unlike(a, b) is None  # paired over seeds 1-2 only: both on X; A's seed 3 is not in the test
    b[1].machine = "Y"
    assert machines_unlike(a, b) == "seed(s) 2 of A and B ran on different machines"
    fixed = [_on(_run("Z", _hits({"q0"})), "X")]
    assert machines_unlike(a, fixed) == "A's seed(s) 3 ran on Y, where none of Z's runs did"
    assert machines_unlike(fixed, a) == "A's seed(s) 3 ran on Y, where none of Z's runs did"
    assert machines_unlike(a[:2], fixed) is None
    assert machines_unlike(a, [_on(_run("Z", _hits({"q0"})), None)]) is None  # not recorded: nothing to say
    with caplog.at_level("WARNING"):
        comparison = compare([*a, *fixed], [("D", "top-1")], StatsSettings(baseline="Z", bootstrap=False))
    assert comparison.cells[("A", "D", "top-1")].recipe is not None
    assert comparison.machine_notes == ["A's seed(s) 3 ran on Y, where none of Z's runs did"]
    assert "A's seed(s) 3 ran on Y" in caplog.text
    assert "**Machines differ**" in report_markdown([*a, *fixed], {}, ks=(1,), comparison=comparison)


def test_a_recipe_test_over_seeds_of_two_machines_carries_the_difference_machine_by_machine():
    """Would catch the split taking the machines of one side only, pairing seeds by position, losing
    the sign where the seedless system is the one compared, or the report leaving the table out: A and
    B at seeds 1-5, seeds 1-3 on X and 4-5 on Y (each seed's two runs on one machine); A - B at top-1 is
    +10, +20, +30 on X and +40, +40 on Y: Δ +20 and +40, F = 480 / (200 / 3) = 7.2 on (1, 3) df."""
    from scipy.stats import f as f_dist

    from taser.evaluation.difference_tables import machine_table

    machines = ["X", "X", "X", "Y", "Y"]
    a = [_on(_run("A", _hits(set(IDS[:h])), seed=s), m) for s, m, h in zip((1, 2, 3, 4, 5), machines, (6, 7, 8, 9, 9))]
    b = [_on(_run("B", _hits(set(IDS[:5])), seed=s), m) for s, m in zip((5, 4, 3, 2, 1), machines[::-1])]  # listed in another order
    comparison = compare([*a, *b], [("D", "top-1")], StatsSettings(baseline="B", bootstrap=False))
    split = comparison.cells[("A", "D", "top-1")].recipe.by_machine
    assert [(m, round(d, 9), s) for m, d, s in split.deltas] == [("X", 20.0, (1, 2, 3)), ("Y", 40.0, (4, 5))]
    assert split.df == (1, 3) and split.f == pytest.approx(7.2) and split.p == pytest.approx(f_dist.sf(7.2, 1, 3))
    table = machine_table([*a, *b], comparison, ks=(1,))
    assert _rows(table)["A"] == [f"A +20.0 (1, 2, 3) · B +40.0 (4, 5); p={split.p:.2g}"] and "Machines: A: X; B: Y." in table
    assert "## Against B, machine by machine" in report_markdown([*a, *b], {}, ks=(1,), comparison=comparison)
    b[3].machine = "Y"  # seed 2's two runs apart: no split (`machines_unlike` names the seed instead)
    apart = compare([*a, *b], [("D", "top-1")], StatsSettings(baseline="B", bootstrap=False))
    assert apart.cells[("A", "D", "top-1")].recipe.by_machine is None and apart.machine_notes == ["seed(s) 2 of A and B ran on different machines"]
    fixed = [_on(_run("Z", _hits(set(IDS[:5]))), "X")]
    against_z = compare([*a, *fixed], [("D", "top-1")], StatsSettings(baseline="Z", bootstrap=False)).cells[("A", "D", "top-1")].recipe.by_machine
    assert [(m, round(d, 9)) for m, d, _ in against_z.deltas] == [("X", 20.0), ("Y", 40.0)] and against_z.p == pytest.approx(split.p)
    turned = compare([*a, *fixed], [("D", "top-1")], StatsSettings(baseline="A", bootstrap=False)).cells[("Z", "D", "top-1")].recipe.by_machine
    assert [(m, round(d, 9)) for m, d, _ in turned.deltas] == [("X", -20.0), ("Y", -40.0)]
    one_machine = [_on(r, "X") for r in a]
    assert compare([*one_machine, *fixed], [("D", "top-1")], StatsSettings(baseline="Z", bootstrap=False)).cells[("A", "D", "top-1")].recipe.by_machine is None
    assert machine_table([*one_machine, *fixed], compare([*one_machine, *fixed], [("D", "top-1")], StatsSettings(baseline="Z", bootstrap=False)), ks=(1,)) == ""


def test_holm_levels_stop_where_holm_stops_and_give_ties_one_level_whatever_their_order():
    """Would catch a comparison Holm did not reach given its own looser step (alpha / (m - i + 1) for its rank)
    instead of the level where the procedure stopped, and tied p-values whose levels depend on read order."""
    from taser.evaluation.comparison import holm_levels

    assert holm_levels([0.001, 0.002], 0.05) == pytest.approx([0.025, 0.05])  # both rejected: each at its own step
    levels = holm_levels([0.001, 0.02, 0.02, 0.3], 0.05)
    assert levels == pytest.approx([0.0125, 0.05 / 3, 0.05 / 3, 0.05 / 3])  # 0.02 fails 0.05/3: Holm stops there
    assert holm_levels([0.3, 0.02, 0.02, 0.001], 0.05) == pytest.approx(levels[::-1])
    # tied at the first step (0.05/3, which 0.01 beats, as Holm's adjusted 0.03 says for both); 0.04 then meets its own 0.05
    assert holm_levels([0.01, 0.01, 0.04], 0.05) == pytest.approx([0.05 / 3, 0.05 / 3, 0.05])
