"""Per-question outcomes beside every results.json (QA, EntityQuestions, BEIR) agree with its
aggregated figures, and an evaluation records its checkpoint's training seed and system name."""

import json

import numpy as np
import pytest
from conftest import FIXTURES, tiny_model_cfg

from taser.evaluation.per_query import PER_QUERY_FILE, metric_values, question_weights, read_per_query
from taser.evaluation.runs import read_run, system_name
from taser.evaluation.topk import CURVE_K, accuracy_from_ranks
from taser.pipeline.evaluate import RetrieverSettings, evaluate_bm25, evaluate_dense
from taser.pipeline.evaluate_ood import evaluate_beir, evaluate_entity_questions
from taser.retrieval.bm25 import BM25Settings

BM25S = {"backend": "bm25s"}


def test_qa_ranks_give_results_top_k_exactly(mini_squad, tmp_path):
    out = tmp_path / "bm25"
    results = evaluate_bm25(mini_squad / "dev.qa.tsv", mini_squad / "passages.tsv", out, bm25={**BM25S, "index_dir": str(tmp_path / "idx")})
    records = read_per_query(out / PER_QUERY_FILE)
    assert results["per_query_file"] == PER_QUERY_FILE and json.loads((out / "results.json").read_text()) == results
    assert [r["id"] for r in records] == [str(i) for i in range(results["questions"])]  # no ids in a QA TSV: 0-based positions
    assert set(records[0]) == {"id", "rank"}  # compact: no texts
    ranks = [r["rank"] for r in records]
    assert any(r is None for r in ranks) or max(ranks) <= 100
    acc = accuracy_from_ranks(ranks, [1, 5, 20, 100])
    assert {str(k): round(v, 2) for k, v in acc.items()} == results["top_k"]
    curve = accuracy_from_ranks(ranks, range(1, CURVE_K + 1))
    assert [round(curve[k], 2) for k in range(1, CURVE_K + 1)] == results["top_k_curve"]
    assert metric_values(records, "top-20").mean() == pytest.approx(results["top_k"]["20"], abs=0.005)
    assert results["seed"] is None and results["system"] == "BM25 (bm25s, k1=0.9, b=0.4)"


def test_entity_questions_ranks_and_weights_give_the_macro_average(tmp_path):
    out = tmp_path / "eq"
    settings = RetrieverSettings("bm25", bm25=BM25Settings(backend="bm25s", index_dir=str(tmp_path / "bm25")))
    results = evaluate_entity_questions(settings, FIXTURES / "entity-questions-tiny" / "test", FIXTURES / "entity-questions-tiny" / "passages.tsv", out)
    records = read_per_query(out / PER_QUERY_FILE)
    assert len(records) == results["questions"] == 6
    assert records[0] == {"id": "P17:0", "relation": "P17", "rank": records[0]["rank"]}
    w = question_weights(records)
    assert w.sum() == pytest.approx(1.0) and w[0] == pytest.approx(1 / (2 * 4))  # 2 relations, P17 has 4 questions
    for k in ("1", "5", "20", "100"):
        assert float(np.sum(w * metric_values(records, f"top-{k}"))) == pytest.approx(results["top_k"][k], abs=0.01)
    assert not (out / "retrieval" / PER_QUERY_FILE).exists()  # one file for the run, not one per relation


def test_beir_per_query_means_are_results_metrics(tmp_path):
    out = tmp_path / "beir"
    results = evaluate_beir(RetrieverSettings("bm25", bm25=BM25Settings(backend="bm25s")), FIXTURES / "beir-tiny", out, work_dir=tmp_path / "work")
    records = read_per_query(out / PER_QUERY_FILE)
    assert len(records) == results["queries_scored"]
    assert set(records[0]) == {"id", "nDCG@10", "nDCG@100", "Recall@10", "Recall@100", "MRR@10"}
    for metric, value in results["metrics"].items():
        assert metric_values(records, metric).mean() == pytest.approx(value, abs=2e-5), metric
    assert read_run(out / "results.json").per_query == records


def test_evaluation_records_the_training_seed_and_system(mini_squad, tiny_pretrained, tmp_path):
    from taser.pipeline.train import run_training

    run_dir = tmp_path / "multirun" / "model=dpr,train.seed=3"  # as a Hydra seed sweep names it
    train = {"batch_size": 2, "hard_negatives": 0, "max_steps": 1, "warmup_steps": 0, "save_every": 0, "val_max_questions": 0,
             "progress": False, "seed": 3, "precision": "fp32", "device": "cpu"}
    final = run_training(tiny_model_cfg(tiny_pretrained, "dpr"), [str(mini_squad / "train.json")], train, run_dir).final_dir
    assert json.loads((run_dir / "train_summary.json").read_text())["config"]["seed"] == 3
    common = dict(qa_file=mini_squad / "dev.qa.tsv", passages_tsv=mini_squad / "passages.tsv", k=5, device="cpu", precision="fp32")
    results = evaluate_dense(final, None, out_dir=tmp_path / "eval", **common)
    assert results["seed"] == 3
    assert results["system"] == "dpr (model=dpr/final)"  # the seed left out: every seed's run is one system
    assert read_run(tmp_path / "eval" / "results.json").seed == 3
    # train.name names the system in every seed's evaluation; evaluate's name= still wins
    summary = json.loads((run_dir / "train_summary.json").read_text())
    summary["config"]["name"] = "dpr, 1 step"
    (run_dir / "train_summary.json").write_text(json.dumps(summary))
    named = evaluate_dense(final, tmp_path / "eval" / "dense-index" / "index", out_dir=tmp_path / "eval2", **common)
    assert (named["seed"], named["system"], named["train_name"]) == (3, "dpr, 1 step", "dpr, 1 step")
    assert system_name({**named, "name": "other"}) == "other"


def test_seed_is_left_out_of_derived_names():
    for path in ("o/multirun/model=dpr,train.seed=1/final", "o/multirun/train.seed=12,model=dpr/final"):
        assert system_name({"retriever": "dense", "model_type": "dpr", "model": path}) == "dpr (model=dpr/final)"
    assert system_name({"retriever": "dense", "model_type": "dpr", "model": "o/dpr/multirun/train.seed=2/final"}) == "dpr (multirun/final)"


def test_a_seed_sweep_names_each_job_by_its_seed():
    """`-m train.seed=1,2,3`: each job's directory (hydra.sweep.subdir) names its seed; train.name stays one system's."""
    from hydra import compose, initialize_config_dir

    from taser.cli import CONFIG_DIR

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose("train", overrides=["model=taser", "train.seed=2", "train.name=taser-T2"], return_hydra_config=True)
    dirname = cfg.hydra.job.override_dirname
    assert "train.seed=2" in dirname and "model=taser" in dirname
    assert cfg.hydra.sweep.subdir == "model=taser,train.name=taser-T2,train.seed=2"
    assert cfg.train.seed == 2 and cfg.train.name == "taser-T2"
