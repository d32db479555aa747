"""The reader's trainer under data parallelism: two CPU processes (gloo), each with half of every
step's questions, must end with the weights of one process that takes the whole batch (the
retriever's DDP helpers: gradients summed over ranks, each rank its slice of the step's questions).
The processes meet through a file in the test's tmp_path."""

import json
import os

import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file
from test_reader_training import retrieval_records

from taser.pipeline.reader import train_reader
from taser.reader.config import ReaderModelSettings, ReaderTrainConfig, TrainReaderJob

pytestmark = pytest.mark.slow


def _job(pretrained, train_file, out, batch_size):
    # dropout off: each rank draws its own dropout masks, one process draws others; a large Adam
    # epsilon keeps updates proportional to gradients (with 1e-8, float noise in a near-zero gradient
    # becomes a full-size step of either sign)
    train = ReaderTrainConfig(batch_size=batch_size, passages=3, max_steps=3, save_every=0, log_every=1, learning_rate=1e-3, warmup_steps=1, adam_eps=1e-3,
                              precision="fp32", device="cpu", progress=False, seed=5)
    return TrainReaderJob(ReaderModelSettings(pretrained=pretrained, max_length=64, max_question_length=16, dropout=0.0), train, str(train_file),
                          output_dir=str(out))


def _worker(rank, world, init_file, pretrained, train_file, out):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), TASER_DIST_INIT=f"file://{init_file}")
    train_reader(_job(pretrained, train_file, out, batch_size=2))


@pytest.mark.rehearsal
def test_two_reader_processes_match_one(tmp_path, tiny_pretrained):
    """Would catch ranks reading the same questions, gradients averaged instead of summed, or a rank's
    slice of the step drawn apart from the single process's order."""
    train_file = tmp_path / "train.json"
    train_file.write_text(json.dumps(retrieval_records()))
    mp.spawn(_worker, args=(2, tmp_path / "dist-init", tiny_pretrained, train_file, tmp_path / "ddp"), nprocs=2, join=True)
    single = train_reader(_job(tiny_pretrained, train_file, tmp_path / "single", batch_size=4))
    ddp_log = [json.loads(line) for line in (tmp_path / "ddp" / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in ddp_log] == [r["step"] for r in single.history] == [1, 2, 3]
    for a, b in zip(ddp_log, single.history):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5) and a["lr"] == b["lr"]
    a, b = load_file(str(tmp_path / "ddp" / "final" / "model.safetensors")), load_file(str(tmp_path / "single" / "final" / "model.safetensors"))
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5, msg=k)
    assert single.history[-1]["loss"] != single.history[0]["loss"]  # the runs trained


def _scored(record: dict) -> dict:
    """A known, uneven score per dev question (its number from the question text), so that a rank's
    share alone, or a share counted twice, gives another total."""
    i = int(record["question"].split()[-1].rstrip("?"))
    return {"em": float(i % 3 == 0), "f1": 0.1 * i}


def _dev_worker(rank, world, init_file, reader_dir, dev_file, out):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), TASER_DIST_INIT=f"file://{init_file}")
    import taser.reader.selection as selection
    from taser.reader.data import read_for_reader
    from taser.reader.model import load_reader
    from taser.training.distributed import destroy_distributed, init_distributed

    info = init_distributed(device="cpu")
    read = []
    real_read = selection.read_passages
    selection.read_passages = lambda model, tok, records, *a, **k: read.append(len(records)) or real_read(model, tok, records, *a, **k)
    selection.predict = lambda record, passages, k, match: _scored(record)
    model, tokenizer = load_reader(reader_dir)
    dev = selection.DevSelection(read_for_reader(dev_file, k=3), 3, "string", 10, 4, out)
    record = dev.evaluate(1, model, tokenizer, "fp32", torch.device("cpu"), info)
    torch.save({"record": record, "read": read}, out / f"rank{rank}.pt")
    destroy_distributed()


def test_dev_evaluation_is_shared_by_the_ranks_and_equals_one_process(tmp_path, tiny_pretrained):
    """Would catch rank 0 reading every dev question while the others wait in a collective (NCCL's
    watchdog ends such a run), or ranks' shares not summed to the one-process figures."""
    import taser.reader.selection as selection
    from taser.reader.data import read_for_reader
    from taser.reader.model import Reader

    records = [r for r in retrieval_records(7, passages=3) if any(c["has_answer"] for c in r["ctxs"])]
    dev_file = tmp_path / "dev.json"
    dev_file.write_text(json.dumps(records))
    torch.manual_seed(0)
    Reader.from_pretrained(tiny_pretrained, 64, 16).save(tmp_path / "reader")
    (tmp_path / "ddp").mkdir()
    mp.spawn(_dev_worker, args=(2, tmp_path / "dist-init", tmp_path / "reader", dev_file, tmp_path / "ddp"), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / "ddp" / f"rank{r}.pt") for r in range(2)]
    assert [r["read"] for r in ranks] == [[4], [3]]  # every rank read its share of the 7 questions
    expected = {"em": 100 * 3 / 7, "f1": 100 * 0.1 * sum(range(7)) / 7}  # questions 0, 3, 6 exact
    for r in ranks:
        assert r["record"]["em"] == pytest.approx(expected["em"]) and r["record"]["f1"] == pytest.approx(expected["f1"])
    # the one-process figures, by the same code on every question
    from taser.reader.model import load_reader

    model, tokenizer = load_reader(tmp_path / "reader")
    real_predict = selection.predict
    try:
        selection.predict = lambda record, passages, k, match: _scored(record)
        single = selection.DevSelection(read_for_reader(dev_file, k=3), 3, "string", 10, 4, tmp_path / "single").score(model, tokenizer, "fp32",
                                                                                                                           torch.device("cpu"))
    finally:
        selection.predict = real_predict
    assert single == pytest.approx((ranks[0]["record"]["em"], ranks[0]["record"]["f1"]))
    assert (tmp_path / "ddp" / "dev_log.jsonl").read_text().count("\n") == 1  # the main rank alone writes the log
