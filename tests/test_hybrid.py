"""Hybrid fusion of BM25 and dense lists: hand-computed scores and orders, pyserini's rule, λ tuning."""

import json
import random
from collections import namedtuple

import pytest

from taser.data.passages import Passage
from taser.retrieval.hybrid import fuse, fuse_many, tune_lambda

BM25 = [("a", 10.0), ("b", 8.0), ("c", 5.0)]
DENSE = [("b", 2.0), ("d", 1.5), ("a", 0.5)]


def test_dpr_rule_by_hand():
    # missing scores: BM25 min 5.0 (for d), dense min 0.5 (for c)
    fused = fuse(BM25, DENSE, lam=1.1, rule="dpr")
    expected = [("a", 10 + 1.1 * 0.5), ("b", 8 + 1.1 * 2.0), ("d", 5 + 1.1 * 1.5), ("c", 5 + 1.1 * 0.5)]
    assert [pid for pid, _ in fused] == [pid for pid, _ in expected]  # 10.55, 10.2, 6.65, 5.55
    assert [s for _, s in fused] == pytest.approx([s for _, s in expected])
    assert fuse(BM25, DENSE, lam=1.1, k=2) == fused[:2]
    # λ = 0 is BM25 alone (d, missing from BM25, ties with c at the minimum; dense rank decides)
    assert [pid for pid, _ in fuse(BM25, DENSE, lam=0.0)] == ["a", "b", "d", "c"]


def test_normalized_rule_by_hand():
    # BM25: min 5, max 10 -> (x - 7.5) / 5; dense: min 0.5, max 2 -> (x - 1.25) / 1.5
    fused = dict(fuse(BM25, DENSE, lam=1.1, rule="normalized"))
    assert fused == pytest.approx({
        "a": 0.5 + 1.1 * -0.5,  # -0.05
        "b": 0.1 + 1.1 * 0.5,  # 0.65
        "c": -0.5 + 1.1 * -0.5,  # -1.05 (missing from dense: its minimum, -1/2)
        "d": -0.5 + 1.1 * (0.25 / 1.5),  # -0.3167
    })
    assert list(fused) == ["b", "a", "d", "c"]


def test_edge_cases():
    assert fuse([], []) == []
    assert fuse([], DENSE, lam=2.0) == [(pid, 2.0 * s) for pid, s in DENSE]  # an empty list adds 0
    assert fuse(BM25, [], rule="normalized") == [("a", 0.5), ("b", pytest.approx(0.1)), ("c", -0.5)]
    # a single hit (max = min) normalises to 0
    assert fuse([("x", 3.0)], [("x", 7.0)], rule="normalized") == [("x", 0.0)]
    # ties: the better dense rank first
    assert fuse([("x", 1.0)], [("y", 0.0)], lam=1.0) == [("y", 1.0), ("x", 1.0)]
    assert fuse_many([BM25, []], [DENSE, []], k=1) == [[("a", pytest.approx(10.55))], []]
    with pytest.raises(ValueError, match="unknown hybrid rule"):
        fuse(BM25, DENSE, rule="rrf")
    with pytest.raises(ValueError, match="2 BM25 result lists but 1 dense"):
        fuse_many([BM25, BM25], [DENSE])


def test_tune_lambda_picks_the_best_on_dev():
    passages = {pid: Passage(pid, text) for pid, text in
                [("p1", "Paris is a city"), ("p2", "a town"), ("p3", "Rome is old"), ("p4", "a village")]}
    answers = [["Paris"], ["Rome"]]
    bm25 = [[("p1", 10.0), ("p2", 5.0)], [("p4", 6.0), ("p3", 5.0)]]
    dense = [[("p2", 1.0), ("p1", 0.9)], [("p3", 2.0), ("p4", 1.0)]]
    # question 1: p1 first iff 10 + 0.9λ > 5 + λ (λ < 50); question 2: p3 first iff 5 + 2λ > 6 + λ (λ > 1)
    best, table = tune_lambda(answers, bm25, dense, passages, grid=[0.0, 0.5, 2.0, 100.0], k=1)
    assert best == 2.0
    assert {lam: acc[1] for lam, acc in table.items()} == {0.0: 50.0, 0.5: 50.0, 2.0: 100.0, 100.0: 50.0}
    best, _ = tune_lambda(answers, bm25, dense, passages, grid=[0.0, 0.5], k=1)
    assert best == 0.0  # ties: the first of the grid


@pytest.mark.pyserini
def test_normalized_rule_is_pyserinis():
    """Against pyserini's own HybridSearcher (normalization=True, weight_on_dense=True)."""
    from taser.retrieval.java import ensure_pyserini

    ensure_pyserini()
    from pyserini.search.hybrid import HybridSearcher

    hit = namedtuple("hit", "docid score")
    rng = random.Random(0)
    for _ in range(20):
        ids = [f"p{i}" for i in range(30)]
        bm25 = sorted(((pid, rng.uniform(0, 30)) for pid in rng.sample(ids, 12)), key=lambda h: -h[1])
        dense = sorted(((pid, rng.uniform(-5, 80)) for pid in rng.sample(ids, 12)), key=lambda h: -h[1])
        lam = rng.choice([0.3, 1.1, 2.5])
        theirs = HybridSearcher._hybrid_results([hit(*h) for h in dense], [hit(*h) for h in bm25], lam, 100,
                                                normalization=True, weight_on_dense=True)
        ours = fuse(bm25, dense, lam=lam, rule="normalized")
        assert dict(ours) == pytest.approx({h.docid: h.score for h in theirs})
        theirs_raw = HybridSearcher._hybrid_results([hit(*h) for h in dense], [hit(*h) for h in bm25], lam, 100,
                                                    weight_on_dense=True)
        assert dict(fuse(bm25, dense, lam=lam)) == pytest.approx({h.docid: h.score for h in theirs_raw})


# --- evaluate_hybrid end to end on the mini SQuAD corpus (tiny random dense model, bm25s) ----------

from test_mining import tiny_dense  # noqa: E402,F401  (the module-scoped checkpoint + index fixture)


def test_evaluate_hybrid_fuses_the_two_retrievers(mini_squad, tiny_dense, tmp_path):  # noqa: F811
    from taser.pipeline.evaluate import evaluate_bm25, evaluate_dense, evaluate_hybrid

    ckpt, index = tiny_dense
    data = dict(qa_file=mini_squad / "dev.qa.tsv", passages_tsv=mini_squad / "passages.tsv", k=20)
    bm25 = {"backend": "bm25s", "index_dir": str(tmp_path / "bm25")}
    evaluate_dense(ckpt, index, out_dir=tmp_path / "dense", **data)
    evaluate_bm25(out_dir=tmp_path / "bm25-eval", bm25=bm25, **data)

    def lists(name):
        return [[(c["id"], c["score"]) for c in r["ctxs"]] for r in json.loads((tmp_path / name / "retrieval.json").read_text())]

    for rule in ("dpr", "normalized"):
        results = evaluate_hybrid(ckpt, index, out_dir=tmp_path / rule, bm25=bm25, lam=1.1, rule=rule, **data)
        assert results["retriever"] == "hybrid" and results["lambda"] == 1.1 and results["rule"] == rule
        assert results["bm25"]["backend"] == "bm25s" and results["model"] == str(ckpt) and results["candidates"] == 20
        expected = fuse_many(lists("bm25-eval"), lists("dense"), lam=1.1, rule=rule, k=20)
        got = lists(rule)
        assert [[pid for pid, _ in r] for r in got] == [[pid for pid, _ in r] for r in expected]
        assert [s for r in got for _, s in r] == pytest.approx([s for r in expected for _, s in r], rel=1e-5)
