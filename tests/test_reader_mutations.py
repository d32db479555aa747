"""The reader on cases built so that one plausible mistake shows: a passage that holds the answer
is never a negative (in the training set or in a batch), `read` answers within
`max_answer_length` tokens (widened to whole words), and the reader's trainer skips an fp16 step
whose gradients overflowed."""

import json

import pytest
import torch

from taser.evaluation.answers import has_answer
from taser.reader.config import ReaderModelSettings, ReaderTrainConfig, ReadJob, TrainReaderJob
from taser.reader.data import training_set
from taser.reader.inputs import encode_passages
from taser.reader.model import Reader

MAX_LENGTH, MAX_QUESTION_LENGTH = 64, 16
FILLER = "This sentence only fills the passage with words about the weather and the sea. " * 8


def _records() -> list[dict]:
    """Per question: passages without the answer (flagged, or unflagged and judged by text),
    passages flagged as holding it, one that holds it only by its text (no flag), and one that
    holds it past `MAX_LENGTH` tokens (so it cannot be a positive, and still holds the answer)."""
    names = ["Ada Lovelace", "Alan Turing", "Grace Hopper", "Edsger Dijkstra", "Barbara Liskov", "Donald Knuth"]
    records = []
    for i, name in enumerate(names):
        ctxs = [
            {"id": f"{i}-0", "title": "Weather", "text": f"Passage about rain number {i}.", "has_answer": False},
            {"id": f"{i}-1", "title": "Machines", "text": f"Machine {i} was designed by {name} long ago.", "has_answer": True},
            {"id": f"{i}-2", "title": "Sea", "text": f"The sea is calm today, says report {i}.", "has_answer": False},
            {"id": f"{i}-3", "title": "Late", "text": FILLER + f"At the very end: {name}.", "has_answer": True},
            {"id": f"{i}-4", "title": "Unflagged", "text": f"{name} built machine {i}."},  # has_answer judged from the text: True
            {"id": f"{i}-5", "title": "Unflagged", "text": f"Nothing at all about machine {i}."},  # judged: False
            {"id": f"{i}-6", "title": "Wind", "text": f"Wind blows from the west {i}.", "has_answer": False},
        ]
        if i % 2:
            ctxs = ctxs[::-1]  # the answer-bearing passages at other ranks
        records.append({"question": f"Who designed machine number {i}?", "answers": [name], "ctxs": ctxs})
    return records


@pytest.fixture
def train_file(tmp_path):
    path = tmp_path / "train-retrieval.json"
    path.write_text(json.dumps(_records()))
    return path


def test_answer_bearing_passages_are_never_negatives(train_file, tokenizer):
    """Would catch passages that hold an answer also used as negatives in the training set (or
    drawn as a batch's negatives), which trains the selection head to reject correct passages."""
    from taser.reader.batches import StepSampler

    data = training_set(train_file, tokenizer, top_n=100, max_length=MAX_LENGTH, max_question_length=MAX_QUESTION_LENGTH)
    records = {r["question"]: r for r in _records()}
    assert len(data.questions) == 6
    for q in data.questions:
        ctxs = records[q.question]["ctxs"]
        holds = {c["id"] for c in ctxs if c.get("has_answer", has_answer(q.answers, c["text"], "string"))}
        assert {c["id"].split("-")[1] for c in ctxs if c["id"] in holds} == {"1", "3", "4"}
        positives, negatives = [c["id"] for c in q.positives], [c["id"] for c in q.negatives]
        assert not set(negatives) & set(positives)
        assert not set(negatives) & holds  # the answer cut off past max_length still holds it: neither positive nor negative
        assert negatives == [c["id"] for c in ctxs if c["id"] not in holds]  # every other passage, in the retriever's order
        assert set(positives) == holds - {c["id"] for c in ctxs if c["id"].endswith("-3")}
    sampler = StepSampler(data.questions, tokenizer, batch_size=2, passages=6, max_answers=10, max_length=MAX_LENGTH,
                          max_question_length=MAX_QUESTION_LENGTH, seed=3)
    for step in range(sampler.steps_per_epoch * 2):
        for index in sampler.question_indexes(step):
            ctxs, q = sampler._sample(step, index)
            holds = {c["id"] for c in records[q.question]["ctxs"] if c.get("has_answer", has_answer(q.answers, c["text"], "string"))}
            assert ctxs[0]["id"] in holds and not {c["id"] for c in ctxs[1:]} & holds
            assert len(ctxs) == 5  # the positive and all 4 negatives


@pytest.fixture(scope="module")
def untrained_reader(tiny_pretrained, tmp_path_factory):
    """A reader with random heads: its spans are wherever its logits fall, most of them long."""
    from transformers import AutoTokenizer

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("reader") / "reader"
    Reader.from_pretrained(tiny_pretrained, MAX_LENGTH, MAX_QUESTION_LENGTH).save(path, AutoTokenizer.from_pretrained(tiny_pretrained))
    return path


LONG_WORDS = "Karpukhin Wojciechowski Szczepanski Lovelace Dijkstra Kowalczykowa Przybyszewski Brzęczyszczykiewicz"


def _read_file(tmp_path):
    records = [{"question": f"Who wrote paper {i}?", "answers": ["Karpukhin"],
                "ctxs": [{"id": f"{i}-{j}", "title": f"Paper {j}", "has_answer": j == 1,
                          "text": " ".join(LONG_WORDS.split()[(i + j) % 4:]) + f" and colleagues, {1990 + i + j}."} for j in range(3)]}
               for i in range(6)]
    path = tmp_path / "retrieval.json"
    path.write_text(json.dumps(records))
    return path, records


def _words_of(prediction: dict, record: dict, tokenizer) -> tuple[set, int]:
    """(the words of the passage tokens inside the prediction's characters, how many tokens)."""
    ctx = next(c for c in record["ctxs"] if c["id"] == prediction["passage_id"])
    inp = encode_passages(tokenizer, record["question"], [ctx], MAX_LENGTH, MAX_QUESTION_LENGTH)[0]
    inside = [t for t, (b, e) in enumerate(inp.offsets) if b >= prediction["char_start"] and e <= prediction["char_end"]]
    assert inside and inp.offsets[inside[0]][0] == prediction["char_start"] and inp.offsets[inside[-1]][1] == prediction["char_end"]
    whole = [t for t, w in enumerate(inp.word_ids) if w in {inp.word_ids[t] for t in inside}]
    assert whole == inside  # whole words: no piece of a word left out
    return {inp.word_ids[t] for t in inside}, len(inside)


def test_read_honours_max_answer_length(untrained_reader, tokenizer, tmp_path):
    """Would catch `read` ignoring `max_answer_length` (the user's setting silently dropped for the
    default): at 1, every answer is one token widened to its word."""
    from taser.pipeline.reader import read

    retrieval, records = _read_file(tmp_path)

    def predictions(max_answer_length, out):
        results = read(ReadJob(str(untrained_reader), str(retrieval), str(tmp_path / out), ks=[1, 3], max_answer_length=max_answer_length,
                               batch_size=4, progress=False, device="cpu", precision="fp32"))
        assert results["max_answer_length"] == max_answer_length
        return json.loads((tmp_path / out / "predictions.json").read_text())

    widened = 0
    for pred, record in zip(predictions(1, "one"), records):
        for k in ("1", "3"):
            by_k = pred["by_k"][k]
            words, tokens = _words_of(by_k, record, tokenizer)
            assert len(words) == 1, by_k  # one token, widened to its word
            assert " " not in by_k["prediction"] and by_k["prediction"]
            widened += tokens > 1
    assert widened  # some of those words are several word pieces
    # the same reader with the default: longer answers, so the setting is what made them short
    longest = max(len(_words_of(p["by_k"][k], r, tokenizer)[0]) for p, r in zip(predictions(10, "ten"), records) for k in ("1", "3"))
    assert longest > 1


def _reader_job(tiny_pretrained, train_file, out, **train):
    settings = {"batch_size": 2, "passages": 4, "max_steps": 1, "save_every": 0, "log_every": 1, "learning_rate": 1e-3,
                "precision": "fp32", "device": "cpu", "progress": False, **train}
    return TrainReaderJob(ReaderModelSettings(pretrained=tiny_pretrained, max_length=MAX_LENGTH, max_question_length=MAX_QUESTION_LENGTH),
                          ReaderTrainConfig(**settings), str(train_file), output_dir=str(out))


def test_an_fp16_overflow_skips_the_readers_step(tiny_pretrained, train_file, tmp_path, monkeypatch, caplog):
    """Would catch the reader's trainer applying an fp16 step whose gradients overflowed (the
    optimizer stepped directly, or the scale never lowered), or never skipping one (the overflow
    read as an error that stops the run): the reader's copy of the retriever's overflow test."""
    import logging

    from safetensors.torch import load_file

    import taser.reader.trainer as trainer_module
    from taser.pipeline.reader import new_reader
    from taser.reader.trainer import ReaderTrainer

    scalers = []

    def huge_scale(precision, device):
        scalers.append(torch.amp.GradScaler("cpu", init_scale=2.0**127))  # as fp16 on a GPU; scaled gradients overflow float32
        return scalers[-1]

    monkeypatch.setattr(trainer_module, "grad_scaler", huge_scale)
    job = _reader_job(tiny_pretrained, train_file, tmp_path / "run")
    model, tokenizer = new_reader(job)
    data = training_set(train_file, tokenizer, 100, MAX_LENGTH, MAX_QUESTION_LENGTH)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with caplog.at_level(logging.WARNING, logger="taser.training.records"):
        result = ReaderTrainer(model, tokenizer, data, job.train, tmp_path / "run").train()
    assert result.steps == 1 and len(scalers) == 1
    (record,) = result.history
    assert record["skipped"] and "fp16 overflow" in caplog.text
    assert scalers[0].get_scale() < 2.0**127  # lowered for the next step
    after = model.state_dict()
    assert all(torch.equal(after[k], v) for k, v in before.items())  # the update was skipped
    final = load_file(str(tmp_path / "run" / "final" / "model.safetensors"))
    assert all(torch.equal(final[k], before[k]) for k in final)
    assert json.loads((tmp_path / "run" / "train_log.jsonl").read_text().splitlines()[0])["skipped"] is True


def test_a_retrieved_copy_of_the_gold_passage_is_never_a_negative(tmp_path, tokenizer):
    """Would catch a retrieved copy of a question's gold passage made a negative when the retrieval
    marks it as not holding the answer (its string match missed: another matcher, another
    normalization): with gold passages known, the gold passage (found by id or by text among the
    retrieved ones) is the one positive, and its retrieved copy is never a negative."""
    from taser.data.errors import DataFormatError
    from taser.reader.gold import read_gold_passages

    names = ["Ada Lovelace", "Alan Turing", "Grace Hopper", "Edsger Dijkstra"]
    gold_text = [f"Machine {i} was designed by {name} in {1900 + i}." for i, name in enumerate(names)]
    gold_file, retrieval = tmp_path / "train.json", tmp_path / "retrieval.json"
    gold_file.write_text(json.dumps([{"question": f"Who designed machine {i}?", "answers": [name], "negative_ctxs": [], "hard_negative_ctxs": [],
                                      "positive_ctxs": [{"passage_id": f"gold-{i}", "title": f"Machine {i}", "text": gold_text[i]}]}
                                     for i, name in enumerate(names)]))
    records = []
    for i, name in enumerate(names):
        # the copy: the gold's id (even questions) or its text under another id (odd), flagged as holding no answer
        copy = {"id": f"gold-{i}" if i % 2 == 0 else f"wiki-{i}", "title": f"Machine {i}", "text": gold_text[i], "has_answer": False}
        ctxs = [{"id": f"neg-{i}-{j}", "title": "Weather", "text": f"Passage {j} talks of the weather {i}.", "has_answer": False} for j in range(3)]
        records.append({"question": f"Who designed machine {i}?", "answers": [name], "ctxs": [ctxs[0], copy, *ctxs[1:]]})
    retrieval.write_text(json.dumps(records))
    data = training_set(retrieval, tokenizer, top_n=100, max_length=MAX_LENGTH, max_question_length=MAX_QUESTION_LENGTH,
                        gold=read_gold_passages(gold_file))
    assert len(data.questions) == 4 and data.gold_positives == 4
    for i, q in enumerate(data.questions):
        assert [c["id"] for c in q.positives] == [f"gold-{i}"]
        assert [c["id"] for c in q.negatives] == [f"neg-{i}-{j}" for j in range(3)]  # the copy is not among them
        assert all(c["text"] != gold_text[i] for c in q.negatives)
    # without the gold passages, the same copies (flagged as holding no answer) are negatives and no question has a positive
    with pytest.raises(DataFormatError, match="no question has a positive"):
        training_set(retrieval, tokenizer, top_n=100, max_length=MAX_LENGTH, max_question_length=MAX_QUESTION_LENGTH)
