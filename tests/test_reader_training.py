"""Reader training and reading on a tiny random BERT: skipped questions counted, resume ends with
the same weights, predictions mapped to the passages' text, the scripts' configs."""

import json

import pytest
import torch
from safetensors.torch import load_file

from taser.data.errors import DataFormatError
from taser.evaluation.per_query import read_per_query
from taser.evaluation.report import markdown_table
from taser.evaluation.runs import read_run
from taser.pipeline.reader import read, train_reader
from taser.reader.config import ReaderModelSettings, ReaderTrainConfig, ReadJob, TrainReaderJob

NAMES = ["Ada Lovelace", "Alan Turing", "Grace Hopper", "Edsger Dijkstra", "Barbara Liskov", "Donald Knuth", "John McCarthy", "Frances Allen"]


def retrieval_records(n: int = 8, passages: int = 6) -> list[dict]:
    """Questions whose positive passage (at a rank that varies) names the answer; the others do not."""
    records = []
    for i in range(n):
        name = NAMES[i % len(NAMES)]
        ctxs = [{"id": f"{i}-{j}", "title": f"Topic {j}", "text": f"Passage {j} says nothing about question {i} but talks of weather.",
                 "score": 10.0 - j, "has_answer": False} for j in range(passages)]
        rank = i % passages
        ctxs[rank] = {**ctxs[rank], "text": f"The machine number {i} was designed by {name} in the year {1900 + i}.", "has_answer": True}
        records.append({"question": f"Who designed machine number {i}?", "answers": [name], "ctxs": ctxs})
    records.append({"question": "Who knows?", "answers": ["Nobody"], "ctxs": records[0]["ctxs"][1:]})  # no positive: skipped
    records[-1]["ctxs"] = [c for c in records[-1]["ctxs"] if not c["has_answer"]]
    return records


@pytest.fixture
def train_file(tmp_path):
    path = tmp_path / "train-retrieval.json"
    path.write_text(json.dumps(retrieval_records()))
    return path


def _job(tiny_pretrained, train_file, out, dev_file=None, **train):
    settings = {"batch_size": 2, "passages": 4, "max_steps": 4, "save_every": 2, "log_every": 1, "learning_rate": 1e-3,
                "precision": "fp32", "device": "cpu", "progress": False, **train}
    return TrainReaderJob(ReaderModelSettings(pretrained=tiny_pretrained, max_length=64, max_question_length=16),
                          ReaderTrainConfig(**settings), str(train_file), dev_file=dev_file, output_dir=str(out))


def test_resumed_reader_training_ends_with_the_same_weights(tmp_path, tiny_pretrained, train_file, monkeypatch):
    """Also the dev selection: the evaluations after the checkpoint are dropped and made again, and
    `best` ends as the uninterrupted run's."""
    dev = {"dev_file": str(train_file), "eval_every": 1, "val_passages": 4}
    straight = train_reader(_job(tiny_pretrained, train_file, tmp_path / "straight", **dev))
    assert straight.steps == 4 and [r["step"] for r in straight.history] == [1, 2, 3, 4]
    summary = json.loads((tmp_path / "straight" / "train_summary.json").read_text())
    assert summary["questions"] == 8 and summary["skipped"]["no positive in the top passages"] == 1
    assert summary["runtime"]["precision"] == "fp32"

    from taser.reader.batches import StepSampler

    batch = StepSampler.batch

    def killed_at_step_3(self, step):
        if step == 2:  # after the checkpoint of step 2
            raise KeyboardInterrupt
        return batch(self, step)

    monkeypatch.setattr(StepSampler, "batch", killed_at_step_3)
    with pytest.raises(KeyboardInterrupt):
        train_reader(_job(tiny_pretrained, train_file, tmp_path / "killed", **dev))
    assert not (tmp_path / "killed" / "final").exists()
    (tmp_path / "killed" / "dev_log.jsonl").open("a").write(json.dumps({"step": 3, "em": 100.0, "f1": 100.0, "questions": 9}) + "\n")  # died after
    monkeypatch.setattr(StepSampler, "batch", batch)
    resumed = train_reader(_job(tiny_pretrained, train_file, tmp_path / "killed", resume=True, **dev))
    assert [r["step"] for r in resumed.history] == [3, 4]
    for mine, theirs in zip(resumed.history, straight.history[2:]):
        assert mine["loss"] == theirs["loss"] and mine["lr"] == theirs["lr"]
    a, b = load_file(str(tmp_path / "straight" / "final" / "model.safetensors")), load_file(str(tmp_path / "killed" / "final" / "model.safetensors"))
    assert a.keys() == b.keys() and {k.split(".")[0] for k in a} == {"encoder", "qa_outputs", "qa_classifier"}
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0, msg=k)
    log = [json.loads(line) for line in (tmp_path / "killed" / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2, 3, 4]
    dev_logs = [(tmp_path / run / "dev_log.jsonl").read_text() for run in ("straight", "killed")]
    assert dev_logs[0] == dev_logs[1] and [json.loads(line)["step"] for line in dev_logs[0].splitlines()] == [1, 2, 3, 4]
    best = [json.loads((tmp_path / run / "train_summary.json").read_text())["dev_best"] for run in ("straight", "killed")]
    assert best[0] == best[1] and best[0]["questions"] == 9
    a, b = load_file(str(tmp_path / "straight" / "best" / "model.safetensors")), load_file(str(tmp_path / "killed" / "best" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_training_learns_and_reading_writes_predictions(tmp_path, tiny_pretrained, train_file):
    result = train_reader(_job(tiny_pretrained, train_file, tmp_path / "run", max_steps=20, save_every=0, log_every=10, learning_rate=3e-3))
    assert result.history[-1]["loss"] < result.history[0]["loss"]
    records = retrieval_records()[:8]
    eval_file = tmp_path / "eval.json"
    eval_file.write_text(json.dumps(records))
    job = ReadJob(str(tmp_path / "run" / "final"), str(eval_file), str(tmp_path / "read"), ks=[5, 1, 6], batch_size=5, progress=False,
                  device="cpu", precision="fp32")
    results = read(job)
    assert results["ks"] == [1, 5, 6] and results["questions"] == 8
    assert results["top_k"] == {"1": 25.0, "5": pytest.approx(100 * 7 / 8), "6": 100.0}
    predictions = json.loads((tmp_path / "read" / "predictions.json").read_text())
    first = predictions[0]
    assert first["question"] == records[0]["question"] and first["answers"] == records[0]["answers"]
    assert first["prediction"] == first["by_k"]["6"]["prediction"] and first["passage_id"].startswith("0-")
    for pred, record in zip(predictions, records):
        one = pred["by_k"]["1"]
        assert one["passage_rank"] == 1 and one["passage_id"] == record["ctxs"][0]["id"]
        text = next(c["text"] for c in record["ctxs"] if c["id"] == pred["passage_id"])
        assert text[pred["by_k"]["6"]["char_start"] : pred["by_k"]["6"]["char_end"]] == pred["prediction"] != ""
    em = sum(p["by_k"]["6"]["em"] for p in predictions) / 8 * 100
    assert results["em"]["6"] == pytest.approx(em)
    with pytest.raises(DataFormatError, match=r"record 0 \('Who designed machine number 0\?'\): 6 passages retrieved, fewer than k=7"):
        read(ReadJob(str(tmp_path / "run" / "final"), str(eval_file), str(tmp_path / "read2"), ks=[7], progress=False, device="cpu"))
    assert not (tmp_path / "read2").exists()


def test_configs_compose_and_refuse_mistakes(tmp_path, tiny_pretrained):
    from hydra import compose, initialize_config_dir

    from taser.cli import CONFIG_DIR, typed
    from taser.reader.config import register_schemas

    register_schemas()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        train = typed(compose(config_name="train_reader", overrides=["train_file=t.json"]))
        assert train.train == ReaderTrainConfig() and train.model.max_length == 256 and train.output_dir == "outputs/reader"
        assert typed(compose(config_name="read", overrides=["checkpoint=c", "retrieval=r", "out_dir=o"])).ks == [1, 5, 20, 50, 100]
        with pytest.raises(ValueError, match="train.passages must be an integer >= 1"):
            typed(compose(config_name="train_reader", overrides=["train_file=t.json", "train.passages=0"]))
        with pytest.raises(ValueError, match="train.eval_every=100 needs dev_file"):
            typed(compose(config_name="train_reader", overrides=["train_file=t.json", "train.eval_every=100"]))
        assert typed(compose(config_name="train_reader", overrides=["train_file=t.json", "dev_file=d.json", "train.eval_every=100"])).dev_file == "d.json"
        with pytest.raises(ValueError, match="ks must be a non-empty list"):
            typed(compose(config_name="read", overrides=["checkpoint=c", "retrieval=r", "out_dir=o", "ks=[]"]))
    with pytest.raises(ValueError, match="is not a reader checkpoint"):
        read(ReadJob(tiny_pretrained, str(tmp_path / "none.json"), str(tmp_path / "o")))


def test_trained_reader_answers_the_questions_it_learned(tmp_path, tiny_pretrained, train_file):
    """Memorising 8 questions catches what a falling loss does not: answer spans labelled one token
    off, start and end swapped, the selection head reading the wrong [CLS], or a span mapped back
    to the wrong characters would each leave exact match near 0. The reading then reaches the
    report: EM beside top-k in the reader's row, named after the retriever whose results.json lies
    beside the retrieval JSON, with the reader's seed, and per-question outcomes that add up."""
    train_reader(_job(tiny_pretrained, train_file, tmp_path / "run", batch_size=4, passages=6, max_steps=30, save_every=0, log_every=10,
                      learning_rate=3e-3, warmup_steps=5, seed=7, name="tiny reader", dev_file=str(train_file), eval_every=5, val_passages=6,
                      val_max_questions=8))
    # DPR's checkpoint choice: best/ holds the weights of the highest dev EM, the earliest on a tie
    dev_log = [json.loads(line) for line in (tmp_path / "run" / "dev_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in dev_log] == [5, 10, 15, 20, 25, 30] and dev_log[0]["em"] < max(r["em"] for r in dev_log)
    best = max(dev_log, key=lambda r: r["em"])
    assert json.loads((tmp_path / "run" / "train_summary.json").read_text())["dev_best"] == best
    reread = read(ReadJob(str(tmp_path / "run" / "best"), str(train_file), str(tmp_path / "read-best"), ks=[6], max_questions=8, progress=False, device="cpu",
                          precision="fp32"))
    assert reread["em"]["6"] == pytest.approx(best["em"])
    retrieval = tmp_path / "bm25-eval"
    retrieval.mkdir()
    records = retrieval_records()[:8]
    records[1]["ctxs"] = [c for c in records[1]["ctxs"] if not c["has_answer"]] + records[0]["ctxs"][1:2]  # no answer: EM 0, rank none
    (retrieval / "retrieval.json").write_text(json.dumps(records))
    (retrieval / "results.json").write_text(json.dumps({"task": "qa", "dataset": "Machines", "retriever": "bm25", "name": "BM25",
                                                         "top_k": {"1": 0.0}}))
    results = read(ReadJob(str(tmp_path / "run" / "final"), str(retrieval / "retrieval.json"), str(tmp_path / "read"), ks=[1, 6],
                           progress=False, device="cpu", precision="fp32"))
    assert results["em"]["6"] == 87.5, json.loads((tmp_path / "read" / "predictions.json").read_text())
    assert (results["name"], results["dataset"], results["retriever"], results["seed"]) == ("tiny reader on BM25", "Machines", "BM25", 7)

    per_query = read_per_query(tmp_path / "read" / "per_query.jsonl")
    assert [q["id"] for q in per_query] == [str(i) for i in range(8)]
    assert [q["rank"] for q in per_query] == [r["ctxs"].index(next(c for c in r["ctxs"] if c["has_answer"])) + 1 if i != 1 else None
                                              for i, r in enumerate(records)]
    for k in ("1", "6"):
        assert sum(q[f"EM@{k}"] for q in per_query) / 8 == pytest.approx(results["em"][k])
        assert sum(q[f"F1@{k}"] for q in per_query) / 8 == pytest.approx(results["f1"][k], abs=1e-3)
        assert sum(q["rank"] is not None and q["rank"] <= int(k) for q in per_query) / 8 * 100 == pytest.approx(results["top_k"][k])

    run = read_run(tmp_path / "read" / "results.json")
    assert (run.task, run.system, run.dataset, run.seed, run.metrics["EM@6"]) == ("reader", "tiny reader on BM25", "Machines", 7, 87.5)
    table = markdown_table([run], ks=[1, 6])
    assert table.splitlines()[0] == ("| system | Machines top-1 | Machines top-6 | Machines EM@1 | Machines EM@6 | Machines F1@1 | Machines F1@6 "
                                     "| seeds | parameters |")
    cells = [c.split(" [")[0].strip() for c in table.splitlines()[2].split("|")[1:-1]]
    f1 = [sum(q[f"F1@{k}"] for q in per_query) / 8 for k in ("1", "6")]
    assert cells[:7] == ["tiny reader on BM25", f"{results['top_k']['1']:.1f}", f"{results['top_k']['6']:.1f}", f"{results['em']['1']:.1f}",
                         "87.5", f"{f1[0]:.1f}", f"{f1[1]:.1f}"]
