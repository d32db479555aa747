"""A path or value the user got wrong is answered in one line, exit status 2, no traceback, before any
model or data loads: each cause its own message (a file that does not exist, a directory given for a
file, a value out of range), the setting named."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from taser.cli import inputs_or_exit, typed_or_exit

CASES = [
    ("train", ["data.train_files=[missing.json]"],
     "Error: data.train_files=missing.json: the file does not exist (the shipped SQuAD data: taser-prepare-squad"),
    ("train", ["data.train_files=[q.tsv]", "data.dev_file=dev.json"], "Error: data.dev_file=dev.json: the file does not exist"),
    ("train", ["data=nq"], "Error: data.train_files=data/downloads/data/retriever/nq-train.json: the file does not exist"),
    ("train", ["model.pretrained=/no/such/model"], "Error: model path not found: /no/such/model"),
    ("train", ["train.batch_size=0"], "Error: train.batch_size must be an integer >= 1, got 0"),
    ("train", ["data.train_files=[q.tsv]", "data.dev_file=null", "model.pretrained=org/no-such-model"],
     "Error: model.pretrained=org/no-such-model: org/no-such-model is not in the local hub cache and the hub cannot be reached (offline); "
     "fetch it once where there is a network: hf download org/no-such-model"),
    ("train", ["data.train_files=[q.tsv]", "data.dev_file=null", "model.pretrained=./ckpt"],
     "Error: model.pretrained=./ckpt: model path ./ckpt holds no config.json"),
    ("evaluate", ["retriever=bm25", "qa_file=missing.qa.tsv"], "Error: qa_file=missing.qa.tsv: the file does not exist"),
    ("evaluate", ["checkpoint=ckpt", "index=no-index", "qa_file=q.tsv", "passages=p.tsv"], "Error: index=no-index: the directory does not exist"),
    ("evaluate", ["checkpoint=ckpt", "index=q.tsv", "qa_file=q.tsv", "passages=p.tsv"], "Error: index=q.tsv: is a file, not a directory"),
    ("encode_passages", ["checkpoint=ckpt", "passages=ckpt"], "Error: passages=ckpt: is a directory, not a file"),
    ("mine_negatives", ["input=missing.json", "passages=p.tsv", "output=out.json"], "Error: input=missing.json: the file does not exist"),
]


@pytest.mark.parametrize("command, settings, said", CASES, ids=[f"{c}-{s[-1]}" for c, s, _ in CASES])
def test_a_wrong_input_is_one_line_and_exit_2_before_anything_loads(command, settings, said, tmp_path):
    (tmp_path / "q.tsv").write_text("who?\t['x']\n")
    (tmp_path / "p.tsv").write_text("id\ttext\ttitle\n1\tx\tX\n")
    (tmp_path / "ckpt").mkdir()  # not a checkpoint: reached only after the data checks
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}  # an empty cache, no network
    done = subprocess.run([sys.executable, "-m", f"taser.{command}", *settings], cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.stderr.strip().splitlines() == [done.stderr.strip()] and done.stderr.startswith(said), done.stderr


def test_a_given_input_that_exists_passes_and_none_is_not_checked(tmp_path):
    (tmp_path / "f").write_text("x")
    inputs_or_exit({"a": str(tmp_path / "f"), "b": None, "c": [str(tmp_path / "f")]}, {"d": str(tmp_path), "e": None})
    with pytest.raises(SystemExit):  # an input not given does not end the checks of those after it
        inputs_or_exit({"a": None, "b": str(tmp_path / "missing")})


def test_a_schema_refusal_is_an_exit_not_a_traceback(capsys):
    from omegaconf import OmegaConf

    from taser.pipeline.jobs import IndexJob

    for given, said in [({"embeddings": "e", "out_dir": "o", "index": {"type": "hnsw", "hnsw_m": 0}}, "Error: index.hnsw_m"),
                        ({"embeddings": "e"}, "Error: out_dir has no value: give it on the command line (out_dir=...)")]:
        with pytest.raises(SystemExit) as exit_:
            typed_or_exit(OmegaConf.merge(OmegaConf.structured(IndexJob), given))
        assert exit_.value.code == 2 and capsys.readouterr().err.startswith(said)
