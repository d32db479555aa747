"""Each script end to end on tiny data (a tiny random BERT, four SQuAD articles), as a user runs it."""

import json
import subprocess
import sys

import pytest
from conftest import ROOT, SQUAD

from taser.data.squad import convert_squad

pytestmark = pytest.mark.slow


def run(script, *overrides):
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / script), *overrides], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{script} failed:\n{proc.stderr[-3000:]}"
    return proc


def run_fails(script, *overrides):
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / script), *overrides], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0
    return proc.stderr


@pytest.mark.parametrize("model", ["dpr", "taser"])
def test_prepare_train_encode_index_evaluate(tmp_path, tiny_pretrained, model):
    data = tmp_path / "data"
    small = tmp_path / "squad-3.json"
    small.write_text(json.dumps({"data": json.loads(SQUAD.read_text())["data"][:3]}))
    if model == "dpr":  # the scripts that do not depend on the model run once, in the dpr case
        out = run("prepare_squad.py", f"squad_json={small}", f"out_dir={data}", "train_articles=2", "random_negatives=2")
        assert json.loads(out.stdout)["train"]["articles"] == 2
    else:
        convert_squad(small, data, train_articles=2, random_negatives=2)
    data_overrides = [f"data.data_dir={data}"]
    train_dir = tmp_path / "run"
    layout = ["model.taser.specialize_every=1"] if model == "taser" else []  # the tiny model has 2 blocks
    run(
        "train.py",
        f"model={model}",
        *layout,
        f"model.pretrained={tiny_pretrained}",
        "model.max_length=64",
        "model.max_question_length=32",
        *data_overrides,
        f"output_dir={train_dir}",
        "train.batch_size=4",
        "train.max_steps=2",
        "train.warmup_steps=1",
        "train.val_max_questions=8",
        "train.progress=false",
    )
    ckpt = train_dir / "final"
    config = json.loads((ckpt / "config.json").read_text())
    assert config["taser"]["model_type"] == model
    assert (ckpt / "model.safetensors").is_file() and (ckpt / "tokenizer.json").is_file()
    assert (train_dir / "checkpoint" / "trainer_state.pt").is_file()

    index = []  # taser: evaluate.py encodes the passages into a flat index itself
    if model == "dpr":
        emb = tmp_path / "emb"
        run("encode_passages.py", f"checkpoint={ckpt}", *data_overrides, f"out_dir={emb}", "shard_id=0", "num_shards=2", "batch_size=16")
        run("encode_passages.py", f"checkpoint={ckpt}", *data_overrides, f"out_dir={emb}", "shard_id=1", "num_shards=2", "batch_size=16")
        assert sorted(p.name for p in emb.glob("shard_*")) == ["shard_000_of_002", "shard_001_of_002"]
        for kind in ("flat", "hnsw"):
            run("build_index.py", f"embeddings={emb}", f"out_dir={tmp_path / kind}", f"index.type={kind}", "index.hnsw_m=16")
        index = [f"index={tmp_path / 'hnsw'}"]
    ev = run("evaluate.py", f"checkpoint={ckpt}", *index, *data_overrides, f"out_dir={tmp_path / 'eval'}")
    assert "top-1" in ev.stdout
    results = json.loads((tmp_path / "eval" / "results.json").read_text())
    assert results["questions"] == len((data / "dev.qa.tsv").read_text().splitlines())
    assert set(results["top_k"]) == {"1", "5", "20", "100"} and results["parameters"] > 0
    assert results["model_type"] == model
    assert results["precision_requested"] == "auto" and results["precision"] in ("fp32", "bf16")  # resolved from the hardware
    assert results["hardware"]["cpu_capability"]
    assert json.loads((train_dir / "train_summary.json").read_text())["runtime"]["precision"] == results["precision"]
    retrieved = json.loads((tmp_path / "eval" / "retrieval.json").read_text())
    assert len(retrieved) == results["questions"]
    assert {"id", "title", "text", "score", "has_answer"} <= set(retrieved[0]["ctxs"][0])
    top20 = sum(any(c["has_answer"] for c in r["ctxs"][:20]) for r in retrieved) / len(retrieved)
    assert top20 * 100 == pytest.approx(results["top_k"]["20"], abs=0.01)


def test_script_errors_are_clear(tmp_path, tiny_pretrained):
    err = run_fails("train.py", "model.pretrained=/no/such/model", f"data.data_dir={tmp_path}", f"output_dir={tmp_path / 'x'}")
    assert "model path not found: /no/such/model" in err
    (tmp_path / "passages.tsv").write_text("id\ttext\ttitle\n1\tx\tX\n")
    err = run_fails(
        "evaluate.py", f"checkpoint={tiny_pretrained}", f"index={tmp_path}", f"data.data_dir={tmp_path}", f"qa_file={ROOT / 'tests/fixtures/nq-test.qa.tsv'}"
    )
    assert "not a taser bi-encoder checkpoint" in err
    err = run_fails("evaluate.py", f"checkpoint={tiny_pretrained}", f"index={tmp_path}", f"data.data_dir={tmp_path / 'none'}",
                    f"qa_file={ROOT / 'tests/fixtures/nq-test.qa.tsv'}")
    assert f"passages={tmp_path / 'none' / 'passages.tsv'}: the file does not exist" in err  # the data first: no checkpoint is opened


def test_multirun_sweeps_negatives(tmp_path, tiny_pretrained, mini_squad):
    """DPR's Table 3 by config: one job per value, each in its own directory."""
    out = tmp_path / "sweep"
    run(
        "train.py",
        "-m",
        f"model.pretrained={tiny_pretrained}",
        "model.max_length=64",
        "model.max_question_length=32",
        f"data.data_dir={mini_squad}",
        f"output_dir={out}",
        "train.batch_size=4",
        "train.max_steps=1",
        "train.warmup_steps=1",
        "train.val_max_questions=0",
        "train.progress=false",
        "train.hard_negatives=0,2",
        "train.in_batch=false",
    )
    jobs = sorted(p.name for p in (out / "multirun").iterdir() if p.is_dir())
    assert len(jobs) == 2 and "train.hard_negatives=0" in jobs[0] and "train.hard_negatives=2" in jobs[1]
    assert all("data.data_dir" not in j and "pretrained" not in j for j in jobs)
    for job in jobs:
        assert (out / "multirun" / job / "final" / "model.safetensors").is_file()


@pytest.mark.parametrize("script", sorted(p.name for p in (ROOT / "scripts").glob("*.py") if not p.name.startswith("_")))
def test_a_python_without_the_environment_is_told_how_to_get_it(script):
    """Issue 47: `python scripts/x.py` from the system's Python (no hydra, no taser) said only
    `No module named 'hydra'`. `-S` leaves site-packages out: this Python then lacks both."""
    done = subprocess.run([sys.executable, "-S", f"scripts/{script}", "model=dpr"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert "not taser's environment" in done.stderr and "source " in done.stderr and f"python scripts/{script} model=dpr" in done.stderr


def test_convert_checkpoint_help_lists_every_conversion():
    from taser.models.convert.conversions import Conversion

    done = subprocess.run([sys.executable, "scripts/convert_checkpoint.py", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True)
    listed = [line.split()[0] for line in done.stdout.split("conversion= one of")[1].split("Examples")[0].strip().splitlines()]
    assert listed == [c.value for c in Conversion]
