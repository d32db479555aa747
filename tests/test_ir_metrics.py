"""BEIR-style nDCG, recall and MRR on a hand-computed example."""

import math

import pytest

from taser.evaluation.ir_metrics import evaluate_qrels


def test_metrics_by_hand():
    qrels = {
        "q1": {"d1": 2, "d2": 1, "d3": 0},
        "q2": {"d5": 1},
        "q3": {"d9": 0},  # nothing relevant: skipped
        "q4": {"d7": 1},  # not in the run: scores 0
    }
    run = {
        "q1": [("d2", 0.6), ("d3", 0.9), ("dX", 0.7), ("d1", 0.8)],  # ranked d3 d1 dX d2
        "q2": [("d4", 1.0), ("d5", 1.0)],  # tie: decreasing doc id puts d5 first
        "q3": [("d9", 1.0)],
        "q9": [("d1", 1.0)],  # no qrels: ignored
    }
    m = evaluate_qrels(run, qrels, ks=(1, 3))
    assert set(m) == {"nDCG@1", "nDCG@3", "Recall@1", "Recall@3", "MRR@10"}
    # q1: gains 0, 2, 0, 1; ideal 2, 1
    q1_ndcg3 = (2 / math.log2(3)) / (2 + 1 / math.log2(3))
    assert q1_ndcg3 == pytest.approx(0.479625, abs=1e-6)
    assert m["nDCG@1"] == pytest.approx((0 + 1 + 0) / 3)
    assert m["nDCG@3"] == pytest.approx((q1_ndcg3 + 1 + 0) / 3)
    assert m["Recall@1"] == pytest.approx((0 + 1 + 0) / 3)
    assert m["Recall@3"] == pytest.approx((0.5 + 1 + 0) / 3)
    assert m["MRR@10"] == pytest.approx((0.5 + 1 + 0) / 3)


def test_mrr_is_cut_at_10_and_duplicates_count_once():
    qrels = {"q": {"rel": 1}}
    run = {"q": [(f"d{i:02d}", 100.0 - i) for i in range(10)] + [("rel", 1.0)]}
    assert evaluate_qrels(run, qrels, ks=(100,))["MRR@10"] == 0.0
    dup = {"q": [("rel", 3.0), ("rel", 2.0), ("other", 1.0)]}
    assert evaluate_qrels(dup, qrels, ks=(2,))["Recall@2"] == 1.0


def test_perfect_run_scores_one():
    qrels = {"q": {"a": 3, "b": 1, "c": 2}}
    run = {"q": [("a", 3.0), ("c", 2.0), ("b", 1.0)]}
    assert evaluate_qrels(run, qrels, ks=(2, 10)) == {"nDCG@2": 1.0, "nDCG@10": 1.0, "Recall@2": 2 / 3, "Recall@10": 1.0, "MRR@10": 1.0}


def test_no_relevant_documents_raises():
    with pytest.raises(ValueError, match="relevant"):
        evaluate_qrels({}, {"q": {"d": 0}})
