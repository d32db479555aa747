"""The reader's scripts end to end on tiny data (a tiny random BERT, hand-made retrieval JSON), as a
user runs them: train, read, and bad input stopping with the file, the record and what is wrong."""

import json
import subprocess
import sys

import pytest
from conftest import ROOT
from test_reader_training import retrieval_records

pytestmark = pytest.mark.slow


@pytest.fixture
def train_file(tmp_path):
    path = tmp_path / "train-retrieval.json"
    path.write_text(json.dumps(retrieval_records()))
    return path


def _script(name, *overrides, ok=True):
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / name), *overrides], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert (proc.returncode == 0) == ok, proc.stderr[-3000:]
    return proc


def test_scripts_end_to_end(tmp_path, tiny_pretrained, train_file):
    out = tmp_path / "reader"
    proc = _script("train_reader.py", f"train_file={train_file}", f"output_dir={out}", f"model.pretrained={tiny_pretrained}",
                   "model.max_length=64", "model.max_question_length=16", "train.batch_size=2", "train.passages=3", "train.max_steps=2",
                   "train.progress=false")
    assert "trained the reader for 2 steps" in proc.stdout
    assert (out / "final" / "model.safetensors").is_file() and (out / "checkpoint" / "trainer_state.pt").is_file()
    eval_file = tmp_path / "eval.json"
    eval_file.write_text(json.dumps(retrieval_records()[:8]))
    proc = _script("read.py", f"checkpoint={out / 'final'}", f"retrieval={eval_file}", f"out_dir={tmp_path / 'read'}", "ks=[1,5]",
                   "progress=false")
    assert "8 questions: EM@1" in proc.stdout
    results = json.loads((tmp_path / "read" / "results.json").read_text())
    assert set(results["em"]) == set(results["f1"]) == {"1", "5"} and results["precision"] in ("fp32", "bf16")
    # bad input stops with the file, the record and what is wrong
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps([retrieval_records()[0], {"question": "q", "answers": ["a"]}]))
    err = _script("read.py", f"checkpoint={out / 'final'}", f"retrieval={broken}", f"out_dir={tmp_path / 'x'}", "ks=[1,5]", ok=False).stderr
    assert f"{broken}, record 1: missing field(s) ['ctxs']" in err
    assert sorted(p.name for p in (tmp_path / "x").iterdir()) == [".hydra"]  # record 0 was read, nothing was written
