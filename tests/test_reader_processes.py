"""A reader stage trains on every GPU of its job (torchrun, one rank each), the stage's batch of
questions split between the ranks as DPR's DataParallel split its 16 x 24 passages over 8 GPUs, with
the same result as one process holding the whole batch."""

import json

import pytest
import torch
from safetensors.torch import load_file
from test_reader_training import train_file  # noqa: F401 - a fixture

import taser.pipeline.process_tree as process_tree
from taser.pipeline.reader_stages import train_reader_stage

MODEL = {"max_length": 64, "max_question_length": 16, "dropout": 0.0}  # no dropout: one process and two draw no masks to compare
TRAIN = {"batch_size": 4, "passages": 4, "max_steps": 3, "save_every": 2, "log_every": 1, "learning_rate": 1e-3, "precision": "fp32",
         "device": "cpu", "warmup_steps": 0, "stage": "open_domain", "seed": 5}


def test_a_reader_stage_on_eight_gpus_runs_eight_ranks_of_two_questions_each(tmp_path, monkeypatch):
    launched = []
    monkeypatch.setattr(process_tree, "run_torchrun", lambda module, spec, spec_file, processes, what, resumes_from:
                        launched.append((module, spec["train"]["batch_size"], processes)))
    train_reader_stage({"pretrained": "x", **MODEL}, None, {**TRAIN, "batch_size": 16}, "gold.json", "retrieval.json", "string", tmp_path, False, 8)
    assert launched == [("taser.pipeline.reader_train_worker", 2, 8)]  # DPR's 16 questions a step, 2 on each of 8 GPUs
    with pytest.raises(ValueError, match="a reader's batch of 12 questions does not split over 8 processes"):
        train_reader_stage({"pretrained": "x", **MODEL}, None, {**TRAIN, "batch_size": 12}, "gold.json", "retrieval.json", "string", tmp_path, False, 8)


@pytest.mark.slow
def test_two_ranks_train_the_reader_as_one_process_with_their_whole_batch(tmp_path, tiny_pretrained, train_file):  # noqa: F811
    model = {"pretrained": tiny_pretrained, **MODEL}
    train_reader_stage(model, None, TRAIN, None, str(train_file), "string", tmp_path / "one", False, 1)
    train_reader_stage(model, None, TRAIN, None, str(train_file), "string", tmp_path / "two", False, 2)
    losses = [[json.loads(line)["loss"] for line in (tmp_path / run / "train_log.jsonl").read_text().splitlines()] for run in ("one", "two")]
    assert len(losses[0]) == 3 and losses[1] == pytest.approx(losses[0], rel=1e-5)  # the same questions and passages at every step
    one, two = load_file(str(tmp_path / "one" / "final" / "model.safetensors")), load_file(str(tmp_path / "two" / "final" / "model.safetensors"))
    assert one.keys() == two.keys()
    for name in one:  # Adam turns the summation order's float differences in a near-zero gradient into steps of up to lr
        torch.testing.assert_close(two[name], one[name], rtol=0, atol=3 * TRAIN["learning_rate"], msg=name)
    assert not (tmp_path / "two" / "checkpoint").exists() and not (tmp_path / "two" / "torchrun-spec.json").exists()
