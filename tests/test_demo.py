"""The demo's chain (BM25 row, mining, zero-shot, training, hybrid, results.md) on tiny data."""

import json

import pytest
import torch
from conftest import SQUAD, tiny_model_cfg

import taser.pipeline.experiment as experiment
from taser.models.settings import ModelSettings
from taser.pipeline.demo import run_demo
from taser.pipeline.jobs import DemoJob
from taser.retrieval.bm25 import BM25Settings
from taser.runtime import resolve_precision
from taser.training.config import TrainConfig

pytestmark = pytest.mark.slow


def test_demo_chain_on_tiny_data(tmp_path, tiny_pretrained, monkeypatch):
    trained_on = []
    real_run_training = experiment.run_training

    def spy_run_training(model_cfg, train_files, *args, **kwargs):
        trained_on.extend(train_files)
        return real_run_training(model_cfg, train_files, *args, **kwargs)

    monkeypatch.setattr(experiment, "run_training", spy_run_training)
    small = tmp_path / "squad-3.json"
    small.write_text(json.dumps({"data": json.loads(SQUAD.read_text())["data"][:3]}))
    cfg = DemoJob(
        squad_json=str(small),
        train_articles=2,
        out_dir=str(tmp_path / "demo"),
        model=ModelSettings.from_value(tiny_model_cfg(tiny_pretrained, "dpr")),
        bm25=BM25Settings(backend="bm25s"),
        train=TrainConfig(batch_size=4, learning_rate=1e-4, max_steps=2, warmup_steps=1, save_every=0, val_max_questions=8, progress=False),
    )
    text = run_demo(cfg)
    assert (tmp_path / "demo" / "results.md").read_text() == text
    assert "![top-k accuracy, k = 1..100](topk-SQuAD.png)" in text  # the report's plot, beside results.md
    assert (tmp_path / "demo" / "topk-SQuAD.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| ")}
    for row in ("BM25 (bm25s, k1=0.9, b=0.4)", "zero-shot (initial model)", "dpr trained", "hybrid (BM25 + dense, λ=1.1)"):
        cells = rows[row].split("|")[2:6]
        top_k = [float(cell.split()[0]) for cell in cells]  # "72.3 [63.4, 80.4]": the figure, then its bootstrap interval
        assert all(0 <= v <= 100 for v in top_k) and top_k == sorted(top_k), row
        assert all("[" in cell for cell in cells), row  # every run wrote per_query.jsonl
    assert "1 BM25 hard negative(s)" in text and "cls pooling, dot similarity" in text
    resolved = resolve_precision("auto")
    assert f"({torch.backends.cpu.get_cpu_capability()}," in text  # the CPU kind beside the figures
    assert f"training in {resolved} (precision=auto), encoding in {resolved} (precision=auto) with PyTorch (backend=torch" in text
    mined = json.loads((tmp_path / "demo" / "data" / "train.bm25.json").read_text())
    assert all(r["hard_negative_ctxs"] for r in mined)
    assert trained_on == [str(tmp_path / "demo" / "data" / "train.bm25.json")]  # training read the mined negatives
    hybrid = json.loads((tmp_path / "demo" / "hybrid" / "results.json").read_text())
    assert hybrid["retriever"] == "hybrid" and hybrid["questions"] > 0
