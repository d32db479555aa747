"""The encoding benchmark's accuracy figures and gate (benchmarks/peers/encode.py), which decide
what `backend=auto` may pick: exact values on hand-made vectors."""

import sys

import numpy as np
import pytest
from conftest import ROOT, load_script

from taser.data.passages import Passage
from taser.data.qa import QAPair


@pytest.fixture(scope="module")
def bench():
    return load_script(ROOT / "benchmarks" / "peers" / "encode.py", "encode_bench")


def test_gate_judges_each_backend_against_torch_over_the_trained_models(bench):
    n = 2000
    hit = np.where(np.arange(n) < n // 2, 100.0, 0.0)
    same = {"top-1": hit, "top-20": hit, "nDCG@10": hit / 100}
    lost = {**same, "top-20": np.where(np.arange(n) < n // 2 - 12, 100.0, 0.0)}  # 12 questions lost: -0.6 point
    outcomes = {(m, "taser", "torch"): same for m in ("dpr", "taser", "zero-shot")}
    outcomes |= {("dpr", "taser", "onnx"): same, ("taser", "taser", "onnx"): same, ("dpr", "taser", "onnx_int8"): same,
                 ("taser", "taser", "onnx_int8"): lost, ("zero-shot", "taser", "onnx"): lost}  # zero-shot: not gated
    verdicts = {v.backend: v for v in bench.gate(outcomes, ["torch", "onnx", "onnx_int8"])}
    assert set(verdicts) == {"onnx", "onnx_int8"} and verdicts["onnx"].outcome == "passes"
    assert [(c.model, c.metric) for c in verdicts["onnx"].checks] == [(m, k) for m in ("dpr", "taser") for k in ("top-1", "top-20", "nDCG@10")]
    failed = verdicts["onnx_int8"]
    assert failed.outcome == "fails" and "taser top-20 significant loss 0.60 point" in failed.summary()
    assert next(c for c in failed.checks if c.label == "taser top-20").p == 2.0**-12  # one-sided, exact: 12 losses, no gain


def test_accuracy_ranks_by_dot_product_and_scores_beir_per_query(bench, tmp_path):
    passages = [Passage("0", "the sky is blue"), Passage("1", "paris is in france"), Passage("2", "grass is green")]
    qa = [QAPair("where is paris", ["france"]), QAPair("what colour is grass", ["green"]), QAPair("who", ["nobody"])]
    p = np.eye(3, dtype=np.float32)
    q = np.array([[0.1, 0.9, 0.0], [0.9, 0.0, 0.5], [1.0, 0.0, 0.0]], np.float32)  # q0 finds 1 first; q1 finds 2 second; q2 none
    np.save(tmp_path / "passages.npy", p)
    np.save(tmp_path / "questions.npy", q)
    # the BEIR queries are questions 0 and 1, their gold passages 1 and 2: ranks 1 and 2
    beir = {"queries": ["train-0", "dev-0"], "rows": [0, 1], "evaluation": [False, True], "qrels": {"train-0": {"1": 1}, "dev-0": {"2": 1}},
            "passage_ids": ["0", "1", "2"]}
    out, per_question = bench.accuracy(tmp_path, bench.AnswerCache(qa, passages), {"beir": beir, "evaluation_rows": [0, 1, 2]})
    assert out["top1"] == pytest.approx(100 / 3) and out["top5"] == pytest.approx(200 / 3) and out["top100"] == pytest.approx(200 / 3)
    assert per_question["top-1"].tolist() == [100.0, 0.0, 0.0] and per_question["top-20"].tolist() == [100.0, 100.0, 0.0]
    assert per_question["nDCG@10"] == pytest.approx([1.0, 1 / np.log2(3)])
    assert out["ndcg10"] == pytest.approx(1 / np.log2(3))  # the table's figures: evaluation questions only
    # question 0 a training question: the figures leave it out, the gate's outcomes keep it
    out, again = bench.accuracy(tmp_path, bench.AnswerCache(qa, passages), {"beir": beir, "evaluation_rows": [1, 2]})
    assert out["top1"] == 0.0 and out["top20"] == pytest.approx(50.0) and again["top-1"].tolist() == per_question["top-1"].tolist()


def test_squad_beir_is_one_query_per_question_of_both_splits_with_its_gold_passage(bench, mini_squad, tmp_path):
    import json
    import shutil

    from taser.data.beir import beir_files, read_beir_corpus, read_beir_split
    from taser.data.passages import read_passages
    from taser.data.qa import read_qa

    data = tmp_path / "data"
    shutil.copytree(mini_squad, data)
    passages = list(read_passages(data / "passages.tsv"))
    by_split = {split: list(read_qa(data / f"{split}.qa.tsv")) for split in bench.SPLITS}
    qa, offsets = by_split["train"] + by_split["dev"], {"train": 0, "dev": len(by_split["train"])}
    counts = {split: len(by_split[split]) for split in bench.SPLITS}
    records = {split: json.loads((data / f"{split}.json").read_text()) for split in bench.SPLITS}
    got = bench.squad_beir(data, passages, qa, offsets, counts)
    files = beir_files(data / "squad-beir")
    assert [d.id for d in read_beir_corpus(files.corpus)] == [p.id for p in passages] == got["passage_ids"]
    queries, qrels = read_beir_split(files)
    every = records["train"] + records["dev"]
    assert len(queries) == len(every) == len(got["queries"]) and len(records["train"]) > 0 and len(records["dev"]) > 0
    for qid, row, evaluation, record in zip(got["queries"], got["rows"], got["evaluation"], every):
        split, position = qid.rsplit("-", 1)
        assert queries[qid] == qa[row].question == by_split[split][int(position)].question == record["question"]
        assert row == offsets[split] + int(position) and evaluation == (split == "dev")
        assert qrels[qid] == {record["positive_ctxs"][0]["passage_id"]: 1}
    # with --limit, only queries whose question and gold passage are kept
    few = bench.squad_beir(data, passages[:5], qa[:10] + by_split["dev"][:10], {"train": 0, "dev": 10}, {"train": 10, "dev": 10})
    assert few["queries"] and all(int(qid.rsplit("-", 1)[1]) < 10 and set(few["qrels"][qid]) <= {p.id for p in passages[:5]} for qid in few["queries"])


def test_the_run_records_this_cpu_kinds_speeds_and_verdicts_for_auto(bench, tmp_path, monkeypatch):
    import json

    from taser.evaluation.encoding_gate import judge
    from taser.models import backend_choice

    kind = backend_choice.CpuKind("Test CPU", "AVX2", False)
    monkeypatch.setattr(backend_choice, "this_cpu", lambda: kind)
    other = {"cpu": "Other", "capability": "AVX512", "native_bf16": True, "backends": {}}
    path = tmp_path / "backend_speeds.json"
    old = {"cpu": "Test CPU", "capability": "AVX2", "native_bf16": False,
           "backends": {"onnx_int8": {"passages_per_s": 9.0, "questions_per_s": 90, "gate": "fails: old"}}}
    path.write_text(json.dumps({"about": "x", "kinds": [other, old]}))
    speed = [{"library": lib, "setting": s, "passages_per_s": p * f, "questions_per_s": 10 * p * f}
             for f in (1.0, 0.5, 2.0) for lib, s, p in (("taser", "torch", 40), ("taser", "openvino", 100), ("sentence-transformers", "onnx", 70))]
    same = np.full(20, 100.0)
    verdicts = [judge("openvino", {("dpr", "top-1"): (same, same)})]
    entry = bench.record_cpu_kind(speed, verdicts, path)
    record = json.loads(path.read_text())
    assert record["kinds"][0] == other and record["kinds"][1] == entry and len(record["kinds"]) == 2  # replaced, the other kept
    assert entry["backends"]["torch"] == {"passages_per_s": 40.0, "questions_per_s": 400, "gate": "passes"}
    assert entry["backends"]["openvino"]["passages_per_s"] == 100.0 and entry["backends"]["openvino"]["gate"].startswith("undecided")
    assert entry["backends"]["openvino"]["recipe"] == 1 and "recipe" not in entry["backends"]["torch"]  # the verdict's recipe
    assert entry["backends"]["onnx_int8"]["gate"] == "fails: old" and "onnx" not in entry["backends"]  # not timed: kept; a peer: never
    assert entry["gate_questions"] == 20 and backend_choice.choose(kind, lambda b: True, {"openvino": 1}, tuple(record["kinds"]))[0] == "torch"


def test_a_section_this_run_does_not_write_is_kept(bench, tmp_path):
    out = tmp_path / "results.md"
    out.write_text("# old head\n\n## Speed\n\nspeed of run A\n\n## Accuracy\n\nold accuracy\n\n## What limits the speed\n\nby hand\n")
    text = bench.write_sections(out, "# new head\n", {bench.ACCURACY: "## Accuracy and the gate\n\nrun B\n"})
    assert text == "# new head\n\n## Speed\n\nspeed of run A\n\n## Accuracy and the gate\n\nrun B\n\n## What limits the speed\n\nby hand\n"
    assert out.read_text() == text


def test_vectors_are_reused_only_from_the_same_model_setting_and_texts(bench, tmp_path, monkeypatch):
    import argparse

    texts, out = tmp_path / "texts", tmp_path / "out"
    texts.mkdir()
    out.mkdir()
    (texts / "passages.pairs.json").write_text('[["t", "a passage"]]')
    (texts / "questions.json").write_text('["a question"]')
    np.save(out / "passages.npy", np.zeros((1, 2), np.float32))
    calls = []

    class Done:
        returncode, stdout, stderr = 0, '{"passages_per_s": 1.0}\n', ""

    monkeypatch.setattr(bench.subprocess, "run", lambda cmd, **kw: calls.append(cmd) or Done())
    args = argparse.Namespace(reuse_vectors=True, batch=64)
    assert bench.run_child("taser", "onnx", str(tmp_path / "dpr"), out, args, texts) == {"passages_per_s": 1.0} and len(calls) == 1
    assert bench.run_child("taser", "onnx", str(tmp_path / "dpr"), out, args, texts)["reused"] and len(calls) == 1
    bench.run_child("taser", "onnx", str(tmp_path / "taser"), out, args, texts)  # another checkpoint: encoded again
    (texts / "questions.json").write_text('["another question"]')
    bench.run_child("taser", "onnx", str(tmp_path / "taser"), out, args, texts)  # other texts: again
    bench.run_child("taser", "onnx", str(tmp_path / "taser"), out, argparse.Namespace(reuse_vectors=False, batch=64), texts)
    assert len(calls) == 4


def test_taser_speed_section_compares_each_backend_with_torch_and_int8_of_the_same_run(bench, tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "run_line", lambda args: "From `a command` on a machine.")
    speeds = {"torch": (20, 200), "onnx_int8": (30, 300), "onnx_int8_static": (33, 360)}
    speed = [{"setting": s, "passages_per_s": p * f, "questions_per_s": q * f, "peak_rss_gb": 1.0, "load_s": 2.0}
             for f in (1.0, 0.9, 1.1) for s, (p, q) in speeds.items()]
    for s in speeds:
        out = tmp_path / "vectors" / "zero-shot" / "taser" / s
        out.mkdir(parents=True)
        np.save(out / "passages.npy", np.array([[1.0, 0.0], [0.0, 1.0]]) + (0.1 if s == "onnx_int8_static" else 0.0))
    args = type("Args", (), {"work": tmp_path, "rounds": 3, "batch": 64})()
    text = bench.taser_speed_section(args, {"passages": [1, 2], "qa": [1]}, speed)
    assert text.startswith(bench.TASER_SPEED + "\n\nFrom `a command` on a machine.")
    row = next(line for line in text.splitlines() if line.startswith("| `onnx_int8_static`"))
    cells = [c.strip() for c in row.split("|")[1:-1]]
    assert cells[1:3] == ["33.0", "360"] and cells[3] == "33.0, 29.7, 36.3"
    assert cells[5] == "1.65x, 1.80x" and cells[6] == "1.10x, 1.20x" and cells[7] == f"{1.1 / np.sqrt(1.1**2 + 0.1**2):.5f}"


def test_a_child_process_reports_its_own_peak_memory_not_its_parents():
    """Linux carries ru_maxrss across exec from the forked parent: every taser setting of the encode benchmark, started
    by a 6 GB parent, reported 6 GB. The figure is the child's own peak (VmHWM)."""
    import resource
    import subprocess

    ballast = bytearray(400 * 1024**2)  # this process's peak above 0.4 GB, whatever ran before
    ballast[:: 4096] = b"x" * len(ballast[:: 4096])
    parent_peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2
    child = subprocess.run([sys.executable, "-c", "import common; print(common.peak_rss_gb())"], cwd=ROOT / "benchmarks",
                           capture_output=True, text=True, check=True)
    assert parent_peak_gb > 0.4 and float(child.stdout) < 0.2
    del ballast


def test_bf16_backends_are_left_out_where_the_cpu_has_no_native_bf16(bench):
    every = list(bench.TASER_BACKENDS)
    kept, left_out = bench.runnable_backends(every, native_bf16=False)
    assert left_out == ["openvino_bf16", "openvino_int8_bf16"] and kept == [b for b in every if b not in left_out]
    assert bench.runnable_backends(every, native_bf16=True) == (every, [])
