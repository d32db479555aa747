"""BEIR's metrics through pytrec_eval: checked by hand, against an independent nDCG written from
trec_eval's definition on a run with ties and unjudged documents, and against BEIR's averaging
(the queries pytrec_eval scores) and identical-id rule."""

import math
import random

import pytest
import pytrec_eval

from taser.evaluation.ir_metrics import drop_identical_ids, evaluate_qrels, judged_run, success_curve


def hand_ndcg(hits, judged, k):
    """nDCG@k from trec_eval's definition: rank by score desc, ties by doc id desc; gain = grade."""
    ranked = [d for d, _ in sorted(dict(hits).items(), key=lambda h: (h[1], h[0]), reverse=True)][:k]
    dcg = sum(max(judged.get(d, 0), 0) / math.log2(i + 2) for i, d in enumerate(ranked))
    ideal = sum(g / math.log2(i + 2) for i, g in enumerate(sorted((g for g in judged.values() if g > 0), reverse=True)[:k]))
    return dcg / ideal if ideal else 0.0


def test_metrics_by_hand():
    qrels = {
        "q1": {"d1": 2, "d2": 1, "d3": 0},
        "q2": {"d5": 1},
        "q3": {"d9": 0},  # nothing relevant: scores 0, and counts (as in BEIR)
        "q4": {"d7": 1},  # not in the run: not scored (pytrec_eval), unless judged_run adds it
    }
    run = {
        "q1": [("d2", 0.6), ("d3", 0.9), ("dX", 0.7), ("d1", 0.8)],  # ranked d3 d1 dX d2
        "q2": [("d4", 1.0), ("d5", 1.0)],  # tie: trec_eval puts the greater doc id, d5, first
        "q3": [("d9", 1.0)],
        "q9": [("d1", 1.0)],  # no qrels: ignored
    }
    m = evaluate_qrels(run, qrels, ks=(1, 3))
    assert set(m) == {"nDCG@1", "nDCG@3", "Recall@1", "Recall@3", "MRR@10", "queries"}
    assert m["queries"] == 3
    q1_ndcg3 = (2 / math.log2(3)) / (2 + 1 / math.log2(3))  # gains 0, 2, 0; ideal 2, 1
    assert m["nDCG@1"] == pytest.approx((0 + 1 + 0) / 3)
    assert m["nDCG@3"] == pytest.approx((q1_ndcg3 + 1 + 0) / 3)
    assert m["Recall@3"] == pytest.approx((0.5 + 1 + 0) / 3)
    assert m["MRR@10"] == pytest.approx((0.5 + 1 + 0) / 3)
    every = evaluate_qrels(judged_run(run, qrels), qrels, ks=(3,))  # BEIR's retrievers: an entry per query
    assert every["queries"] == 4 and every["nDCG@3"] == pytest.approx((q1_ndcg3 + 1 + 0 + 0) / 4)


def test_ndcg_against_pytrec_eval_and_the_definition_with_ties_and_unjudged():
    rng = random.Random(0)
    docs = [f"d{i:02d}" for i in range(40)]
    qrels, run = {}, {}
    for q in range(30):
        judged = {d: rng.choice([0, 0, 1, 2, 3]) for d in rng.sample(docs, 8)}  # the other 32 docs are unjudged
        judged[rng.choice(docs)] = 1
        qrels[f"q{q}"] = judged
        # scores on a coarse grid: many ties, broken by doc id
        run[f"q{q}"] = [(d, float(rng.randint(0, 5))) for d in rng.sample(docs, 25)]
    assert any(len({s for _, s in hits}) < len(hits) for hits in run.values())  # ties there are
    ours = evaluate_qrels(run, qrels, ks=(10, 100))
    library = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10", "recall.100"}).evaluate({q: dict(h) for q, h in run.items()})
    assert ours["nDCG@10"] == pytest.approx(sum(s["ndcg_cut_10"] for s in library.values()) / len(library), abs=1e-12)
    assert ours["Recall@100"] == pytest.approx(sum(s["recall_100"] for s in library.values()) / len(library), abs=1e-12)
    assert ours["nDCG@10"] == pytest.approx(sum(hand_ndcg(run[q], qrels[q], 10) for q in qrels) / len(qrels), abs=1e-9)


def test_identical_ids_are_dropped_as_beir_does():
    qrels = {"q1": {"q1": 1, "d2": 1}}
    run = {"q1": [("q1", 9.0), ("d1", 5.0), ("d2", 4.0)]}
    kept, dropped = drop_identical_ids(run)
    assert dropped == 1 and kept == {"q1": [("d1", 5.0), ("d2", 4.0)]}
    assert evaluate_qrels(run, qrels, ks=(1,))["nDCG@1"] == 1.0
    assert evaluate_qrels(kept, qrels, ks=(1,))["nDCG@1"] == 0.0
    assert evaluate_qrels(kept, qrels, ks=(1,))["MRR@10"] == 0.5


def test_mrr_is_cut_at_10_and_duplicates_count_once():
    qrels = {"q": {"rel": 1}}
    tenth = {"q": [(f"d{i:02d}", 100.0 - i) for i in range(9)] + [("rel", 1.0)]}
    assert evaluate_qrels(tenth, qrels, ks=(100,))["MRR@10"] == pytest.approx(0.1)
    eleventh = {"q": [(f"d{i:02d}", 100.0 - i) for i in range(10)] + [("rel", 1.0)]}
    assert evaluate_qrels(eleventh, qrels, ks=(100,))["MRR@10"] == 0.0
    dup = {"q": [("rel", 3.0), ("rel", 2.0), ("other", 1.0)]}
    assert evaluate_qrels(dup, qrels, ks=(2,))["Recall@2"] == 1.0


def test_perfect_run_and_success_curve():
    qrels = {"q": {"a": 3, "b": 1, "c": 2}, "r": {"z": 1}}
    run = {"q": [("a", 3.0), ("c", 2.0), ("b", 1.0)], "r": [("y", 2.0), ("x", 1.5), ("z", 1.0)]}
    m = evaluate_qrels(run, qrels, ks=(10,))
    assert m["nDCG@10"] == pytest.approx((1.0 + 0.5) / 2) and m["Recall@10"] == 1.0
    assert success_curve(run, qrels, max_k=4) == [50.0, 50.0, 100.0, 100.0]


def test_bad_input():
    with pytest.raises(ValueError, match="empty qrels"):
        evaluate_qrels({}, {})
    with pytest.raises(ValueError, match="none of the judged queries"):
        evaluate_qrels({"x": [("d", 1.0)]}, {"q": {"d": 1}})
    with pytest.raises(ValueError, match="positive"):
        evaluate_qrels({"q": []}, {"q": {"d": 1}}, ks=(0,))
