"""The reader's recipe: a reading-comprehension stage on gold passages alone, an open-domain stage
whose positive is the gold passage, the heads' own learning rate, and the answer length recorded in
the checkpoint (tiny random BERT)."""

import json

import pytest
import torch
from safetensors.torch import load_file

from taser.data.errors import DataFormatError
from taser.pipeline.reader import read, train_reader, training_data
from taser.reader.batches import StepSampler
from taser.reader.config import ReaderModelSettings, ReaderStage, ReaderTrainConfig, ReadJob, TrainReaderJob
from taser.reader.gold import read_gold_passages
from taser.reader.model import Reader, read_reader_config
from taser.reader.optim import reader_param_groups

NAMES = ["Ada Lovelace", "Alan Turing", "Grace Hopper", "Edsger Dijkstra", "Barbara Liskov", "Donald Knuth"]


def gold_ctx(i: int) -> dict:
    return {"passage_id": f"gold-{i}", "title": f"Machine {i}", "text": f"Machine {i} was designed by {NAMES[i]} in {1900 + i}."}


def biencoder_records(n: int = 6) -> list[dict]:
    return [{"question": f"Who designed machine {i}?", "answers": [NAMES[i]], "positive_ctxs": [gold_ctx(i)], "negative_ctxs": [],
             "hard_negative_ctxs": []} for i in range(n)]


def retrieval_records(n: int = 6, retrieve_gold: bool = True) -> list[dict]:
    """Retrieved passages: a decoy that names the answer too (not the gold), answer-free passages,
    and the gold passage itself at rank 3 when `retrieve_gold`."""
    records = []
    for i in range(n):
        ctxs = [{"id": f"decoy-{i}", "title": "Decoy", "text": f"{NAMES[i]} once visited a museum of old machines.", "has_answer": True}]
        ctxs += [{"id": f"neg-{i}-{j}", "title": f"Other {j}", "text": f"Passage {j} talks of the weather.", "has_answer": False} for j in range(3)]
        if retrieve_gold:
            g = gold_ctx(i)
            ctxs.insert(2, {"id": g["passage_id"], "title": g["title"], "text": g["text"], "has_answer": True})
        records.append({"question": f"Who designed machine {i}?", "answers": [NAMES[i]], "ctxs": ctxs})
    return records


@pytest.fixture
def files(tmp_path):
    gold, retrieved = tmp_path / "train.json", tmp_path / "retrieval.json"
    gold.write_text(json.dumps(biencoder_records()))
    retrieved.write_text(json.dumps(retrieval_records()))
    return gold, retrieved


def _job(tiny_pretrained, out, model=None, **train):
    settings = {"batch_size": 2, "passages": 3, "max_steps": 2, "save_every": 0, "log_every": 1, "learning_rate": 1e-3,
                "precision": "fp32", "device": "cpu", "progress": False, **train}
    files = {k: train.pop(k) for k in ("train_file", "gold_file") if k in train}
    settings = {k: v for k, v in settings.items() if k not in files}
    return TrainReaderJob(ReaderModelSettings(pretrained=tiny_pretrained, max_length=64, max_question_length=16, **(model or {})),
                          ReaderTrainConfig(**settings), output_dir=str(out), **files)


def _batch_passages(tokenizer, sampler: StepSampler, step: int) -> list[list[str]]:
    """The passages (decoded text after the title) of each question of a step's batch."""
    batch = sampler.batch(step)
    rows = []
    for question in range(batch.input_ids.shape[0]):
        texts = []
        for m in range(batch.input_ids.shape[1]):
            if batch.passage_mask[question, m]:
                ids = batch.input_ids[question, m][batch.attention_mask[question, m].bool()].tolist()
                texts.append(tokenizer.decode(ids[ids.index(tokenizer.sep_token_id, ids.index(tokenizer.sep_token_id) + 1) + 1 :]))
        rows.append(texts)
    return rows


def test_the_reading_stage_trains_on_gold_passages_only(tmp_path, tiny_pretrained, tokenizer, files):
    gold, retrieved = files
    job = _job(tiny_pretrained, tmp_path / "r", stage="reading", gold_file=str(gold), train_file=str(retrieved), batch_size=3)
    model = Reader.from_pretrained(tiny_pretrained, 64, 16)
    data = training_data(job, tokenizer, model.config)
    assert [q.positives for q in data.questions] == [[{"id": f"gold-{i}", "title": f"Machine {i}", "text": gold_ctx(i)["text"], "has_answer": True}]
                                                    for i in range(6)]
    assert all(q.negatives == [] for q in data.questions) and data.gold_positives == 6
    sampler = StepSampler(data.questions, tokenizer, 3, 24, 10, 64, 16, seed=1)
    seen = [texts for step in range(2) for texts in _batch_passages(tokenizer, sampler, step)]
    assert all(len(texts) == 1 for texts in seen)  # one passage per question, whatever train.passages says
    assert sorted(t[0] for t in seen) == sorted(tokenizer.decode(tokenizer(gold_ctx(i)["text"], add_special_tokens=False)["input_ids"])
                                                for i in range(6))
    result = train_reader(job)  # and the stage runs: the selection loss is 0 with one passage per question
    assert result.steps == 2 and all(r["aux_selection_loss"] == 0 for r in result.history)


def test_the_reading_stage_takes_the_questions_of_the_gold_file_alone(tmp_path, tiny_pretrained, tokenizer, files):
    gold, _ = files
    job = _job(tiny_pretrained, tmp_path / "r", stage="reading", gold_file=str(gold))
    data = training_data(job, tokenizer, Reader.from_pretrained(tiny_pretrained, 64, 16).config)
    assert [q.question for q in data.questions] == [f"Who designed machine {i}?" for i in range(6)]
    assert [q.answers for q in data.questions] == [[n] for n in NAMES]


def test_the_open_domain_stage_takes_the_gold_passage_as_its_positive(tmp_path, tiny_pretrained, tokenizer, files):
    gold, retrieved = files
    config = Reader.from_pretrained(tiny_pretrained, 64, 16).config
    with_gold = training_data(_job(tiny_pretrained, tmp_path / "o", gold_file=str(gold), train_file=str(retrieved)), tokenizer, config)
    for i, q in enumerate(with_gold.questions):
        assert [c["id"] for c in q.positives] == [f"gold-{i}"]
        assert [c["id"] for c in q.negatives] == [f"neg-{i}-{j}" for j in range(3)]  # neither the gold nor the answer-bearing decoy
    without = training_data(_job(tiny_pretrained, tmp_path / "o", train_file=str(retrieved)), tokenizer, config)
    assert [sorted(c["id"] for c in q.positives) for q in without.questions] == [sorted([f"decoy-{i}", f"gold-{i}"]) for i in range(6)]
    assert without.gold_positives == 0 and with_gold.gold_positives == 6

    missed = tmp_path / "missed.json"  # the retriever missed the gold passage: it is still the positive
    missed.write_text(json.dumps(retrieval_records(retrieve_gold=False)))
    added = training_data(_job(tiny_pretrained, tmp_path / "o", gold_file=str(gold), train_file=str(missed)), tokenizer, config)
    assert [[c["id"] for c in q.positives] for q in added.questions] == [[f"gold-{i}"] for i in range(6)]


def test_dprs_gold_passage_files_are_read_and_need_the_answers_from_the_retrieval(tmp_path, tiny_pretrained, tokenizer, files):
    _, retrieved = files
    info = tmp_path / "nq_train.json"
    info.write_text(json.dumps({"data": [{"question": f"who designed machine {i}", "title": f"Machine {i}", "context": gold_ctx(i)["text"],
                                          "example_id": 100 + i} for i in range(6)]}))
    gold = read_gold_passages(info)
    assert gold["who designed machine 3"].ctx["text"] == gold_ctx(3)["text"] and gold["who designed machine 3"].answers is None
    config = Reader.from_pretrained(tiny_pretrained, 64, 16).config
    with pytest.raises(DataFormatError, match="no answers: give train_file"):
        training_data(_job(tiny_pretrained, tmp_path / "r", stage="reading", gold_file=str(info)), tokenizer, config)
    records = retrieval_records()
    for r in records:
        r["question"] = r["question"].rstrip("?")  # no question mark, as NQ's; the case differs from the gold file's, as it may
    retrieved.write_text(json.dumps(records))
    data = training_data(_job(tiny_pretrained, tmp_path / "r", stage="reading", gold_file=str(info), train_file=str(retrieved)), tokenizer, config)
    assert [q.positives[0]["id"] for q in data.questions] == [str(100 + i) for i in range(6)]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"data": [{"question": "q", "title": "t"}]}))
    with pytest.raises(DataFormatError, match=r"data\[0\].*'question' and 'context'"):
        read_gold_passages(bad)


def test_stages_refuse_missing_files():
    with pytest.raises(ValueError, match="train.stage=reading trains on gold passages: give gold_file"):
        TrainReaderJob(train=ReaderTrainConfig(stage="reading"), train_file="t.json", output_dir="o")
    with pytest.raises(ValueError, match="train.stage=open_domain reads retrieved passages: give train_file"):
        TrainReaderJob(gold_file="g.json", output_dir="o")
    with pytest.raises(ValueError, match="unknown train.stage 'gold'"):
        ReaderTrainConfig(stage="gold")
    with pytest.raises(ValueError, match="train.head_learning_rate must be > 0"):
        ReaderTrainConfig(head_learning_rate=0.0)
    assert ReaderTrainConfig(stage="reading").stage is ReaderStage.reading


def test_the_head_learning_rate_reaches_the_heads_group_and_only_it(tiny_pretrained):
    model = Reader.from_pretrained(tiny_pretrained, 64, 16)
    heads = {id(p) for m in (model.qa_outputs, model.qa_classifier) for p in m.parameters()}
    groups = reader_param_groups(model, 1e-5, 0.01, head_learning_rate=3e-3)
    for group in groups:
        ids = {id(p) for p in group["params"]}
        assert (ids <= heads and group["lr"] == 3e-3 and group["name"] == "heads") or (not ids & heads and group["lr"] == 1e-5)
    assert {id(p) for g in groups for p in g["params"]} == {id(p) for p in model.parameters()}
    assert sum(len(g["params"]) for g in groups) == len(list(model.parameters()))
    assert [g["weight_decay"] for g in groups if g["name"] == "heads"] == [0.01, 0.0]  # weights decay, biases do not
    assert all(g["lr"] == 1e-5 for g in reader_param_groups(model, 1e-5, 0.01))  # unset: one rate


def test_one_step_moves_the_heads_by_their_rate_and_the_encoder_by_its_own(tmp_path, tiny_pretrained, files):
    """Adam's first step moves each weight with a gradient by lr (the sign of its gradient): with no
    warm-up, the heads' weights move by head_learning_rate and the encoder's by learning_rate."""
    gold, retrieved = files
    job = _job(tiny_pretrained, tmp_path / "r", stage="reading", gold_file=str(gold), batch_size=6, max_steps=1, learning_rate=1e-6,
               head_learning_rate=1e-2, warmup_steps=0, grad_clip=0.0, adam_eps=1e-30)
    torch.manual_seed(job.train.seed)
    before = Reader.from_pretrained(tiny_pretrained, 64, 16).state_dict()
    result = train_reader(job)
    after = load_file(str(tmp_path / "r" / "final" / "model.safetensors"))
    assert result.history[0]["lr"] == 1e-6 and result.history[0]["head_lr"] == 1e-2
    for name in ("qa_outputs.weight", "qa_outputs.bias"):
        moved = (after[name] - before[name]).abs()
        assert torch.allclose(moved[moved > 0], torch.full_like(moved[moved > 0], 1e-2), rtol=1e-3) and (moved > 0).float().mean() > 0.9
    moved = (after["encoder.encoder.layer.1.output.dense.weight"] - before["encoder.encoder.layer.1.output.dense.weight"]).abs()
    assert moved.max() <= 1.001e-6 and moved.max() > 0.5e-6


def test_max_answer_length_is_recorded_in_the_checkpoint_and_read_by_default(tmp_path, tiny_pretrained, files):
    gold, retrieved = files
    train_reader(_job(tiny_pretrained, tmp_path / "r", model={"max_answer_length": 2}, gold_file=str(gold), train_file=str(retrieved)))
    assert read_reader_config(tmp_path / "r" / "final")[0].max_answer_length == 2
    assert json.loads((tmp_path / "r" / "train_summary.json").read_text())["model"]["max_answer_length"] == 2
    results = read(ReadJob(str(tmp_path / "r" / "final"), str(retrieved), str(tmp_path / "read"), ks=[1, 2], progress=False))
    predictions = json.loads((tmp_path / "read" / "predictions.json").read_text())
    assert results["max_answer_length"] == 2
    assert all(len(p["by_k"][k]["prediction"].split()) <= 2 for p in predictions for k in ("1", "2"))  # tiny vocabulary: whole words
    wider = read(ReadJob(str(tmp_path / "r" / "final"), str(retrieved), str(tmp_path / "read5"), ks=[1], max_answer_length=5, progress=False))
    assert wider["max_answer_length"] == 5
    continued = _job(tiny_pretrained, tmp_path / "c", gold_file=str(gold), train_file=str(retrieved))
    continued.model.init_checkpoint = str(tmp_path / "r" / "final")
    train_reader(continued)
    assert read_reader_config(tmp_path / "c" / "final")[0].max_answer_length == 2  # kept when not set again
