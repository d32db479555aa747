"""The encoding benchmark's accuracy figures and gate (benchmarks/peers/encode.py), which decide
what `backend=auto` may pick: exact values on hand-made vectors."""

import importlib.util
import sys

import numpy as np
import pytest
from conftest import ROOT

from taser.data.passages import Passage
from taser.data.qa import QAPair


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("encode_bench", ROOT / "benchmarks" / "peers" / "encode.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def scores(top20: float, ndcg: float) -> dict:
    return {"top1": 0.0, "top5": 0.0, "top20": top20, "top100": 100.0, "ndcg10": ndcg}


def test_gate_fails_a_backend_past_either_bound_and_names_why(bench):
    acc = {
        ("dpr", "taser", "torch"): scores(80.0, 0.700), ("taser", "taser", "torch"): scores(82.0, 0.650),
        ("dpr", "taser", "onnx"): scores(79.6, 0.6951), ("taser", "taser", "onnx"): scores(82.0, 0.650),  # 0.4 point, 0.0049: passes
        ("dpr", "taser", "onnx_int8"): scores(79.4, 0.700), ("taser", "taser", "onnx_int8"): scores(82.0, 0.640),  # 0.6 point; nDCG -0.01
        ("zero-shot", "taser", "torch"): scores(70.0, 0.5), ("zero-shot", "taser", "onnx"): scores(60.0, 0.5),  # zero-shot top-20: not gated
    }
    failed = bench.gate(acc)
    assert set(failed) == {"onnx_int8"}
    assert "dpr top-20 79.4 vs 80.0" in failed["onnx_int8"] and "taser nDCG@10 0.6400 vs 0.6500" in failed["onnx_int8"]


def test_accuracy_ranks_by_dot_product_and_scores_beir_with_trec_eval(bench, tmp_path):
    passages = [Passage("0", "the sky is blue"), Passage("1", "paris is in france"), Passage("2", "grass is green")]
    qa = [QAPair("where is paris", ["france"]), QAPair("what colour is grass", ["green"]), QAPair("who", ["nobody"])]
    p = np.eye(3, dtype=np.float32)
    q = np.array([[0.1, 0.9, 0.0], [0.9, 0.0, 0.5], [1.0, 0.0, 0.0]], np.float32)  # q0 finds 1 first; q1 finds 2 second; q2 none
    np.save(tmp_path / "passages.npy", p)
    np.save(tmp_path / "questions.npy", q)
    np.save(tmp_path / "beir-corpus.npy", np.eye(2, dtype=np.float32))
    np.save(tmp_path / "beir-queries.npy", np.array([[0.0, 1.0]], np.float32))  # ranks d2 over d1
    prepared = {"beir_ids": ["d1", "d2"], "beir_queries": ["q1"], "qrels": {"q1": {"d1": 1}}}
    out = bench.accuracy(tmp_path, bench.AnswerCache(qa, passages), prepared)
    assert out["top1"] == pytest.approx(100 / 3) and out["top5"] == pytest.approx(200 / 3) and out["top100"] == pytest.approx(200 / 3)
    assert out["ndcg10"] == pytest.approx(1 / np.log2(3))  # the one relevant document at rank 2
