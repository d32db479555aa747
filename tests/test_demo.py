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


def test_demo_chain_on_tiny_data(tmp_path, tiny_pretrained, monkeypatch, caplog):
    trained_on = []
    real_run_training = experiment.run_training

    def spy_run_training(model_cfg, train_files, *args, **kwargs):
        trained_on.extend(train_files)
        return real_run_training(model_cfg, train_files, *args, **kwargs)

    monkeypatch.setattr(experiment, "run_training", spy_run_training)
    cfg = DemoJob(
        squad_json=str(SQUAD),
        articles=3,  # the first 3 of the 40 (as make quickstart takes 8)
        train_articles=2,
        out_dir=str(tmp_path / "demo"),
        model=ModelSettings.from_value(tiny_model_cfg(tiny_pretrained, "dpr")),
        bm25=BM25Settings(backend="bm25s"),
        train=TrainConfig(batch_size=4, learning_rate=1e-4, max_steps=2, warmup_steps=1, save_every=0, val_max_questions=8, progress=False),
    )
    with caplog.at_level("INFO", logger="taser.progress"):
        text = run_demo(cfg)
    encoding = [r.getMessage() for r in caplog.records if r.getMessage().startswith("encode passages")]
    assert len(encoding) >= 4, encoding  # the zero-shot and the trained model's passages each report (a line every 30 s when long)
    assert (tmp_path / "demo" / "results.md").read_text() == text
    assert "![top-k accuracy, k = 1..100](topk-SQuAD.png)" in text  # the report's plot, beside results.md
    assert (tmp_path / "demo" / "topk-SQuAD.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| ")}
    for row in ("BM25 (bm25s, k1=0.9, b=0.4)", "zero-shot (initial model)", "dpr trained", "hybrid (BM25 + dense, λ=1.1)"):
        cells = rows[row].split("|")[2:6]
        top_k = [float(cell.split()[0]) for cell in cells]  # "72.3 [63.4, 80.4]": the figure, then its bootstrap interval
        assert all(0 <= v <= 100 for v in top_k) and top_k == sorted(top_k), row
        assert all("[" in cell for cell in cells), row  # every run wrote per_query.jsonl
    assert "(3 articles, 100 words)" in text and "(last 1 articles)" in text
    assert "1 BM25 hard negative(s)" in text and "cls pooling, dot similarity" in text
    resolved = resolve_precision("auto")
    assert f"({torch.backends.cpu.get_cpu_capability()}," in text  # the CPU kind beside the figures
    assert f"training in {resolved} (precision=auto), encoding in {resolved} (precision=auto) with PyTorch (backend=torch" in text
    mined = json.loads((tmp_path / "demo" / "data" / "train.bm25.json").read_text())
    assert all(r["hard_negative_ctxs"] for r in mined)
    assert trained_on == [str(tmp_path / "demo" / "data" / "train.bm25.json")]  # training read the mined negatives
    from taser.models.biencoder import read_checkpoint_config

    # zero-shot is the pretrained encoder once: a DPR pair's two encoders are one model before training
    assert str(read_checkpoint_config(tmp_path / "demo" / "zero-shot" / "initial")[0].model_type) == "shared"
    hybrid = json.loads((tmp_path / "demo" / "hybrid" / "results.json").read_text())
    assert hybrid["retriever"] == "hybrid" and hybrid["questions"] > 0


def test_the_quickstart_settings_compose_and_pass_the_key_check():
    import re

    from conftest import ROOT
    from hydra import compose, initialize_config_dir

    from taser.cli import CONFIG_DIR, typed
    from taser.override_check import check_overrides

    settings = re.search(r"^QUICKSTART_SETTINGS := (.+)$", (ROOT / "Makefile").read_text(), re.M).group(1).split()
    check_overrides(CONFIG_DIR, "demo", settings)
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        job = typed(compose("demo", overrides=settings))
    assert job.articles == 8 and job.train_articles == 6 and job.train.max_steps == 20


def test_the_readmes_quickstart_figures_are_the_recorded_ones():
    import re

    from conftest import ROOT

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    recorded = (ROOT / "benchmarks" / "quickstart" / "results.md").read_text(encoding="utf-8")
    median = float(re.search(r"median \*\*([\d.]+) s\*\*", recorded).group(1))
    assert f"it took {round(median)} s, set-up excluded (`benchmarks/quickstart/results.md`)" in readme
    rows = {line.split("|")[1].strip(): line.split("|")[2:6] for line in recorded.splitlines() if line.startswith("| ") and "[" in line}
    shown = [line for line in readme.split("make quickstart", 1)[1].split("Then, for every", 1)[0].splitlines() if line.startswith("| ") and "[" in line]
    assert len(shown) == 4
    for line in shown:
        assert line.split("|")[2:6] == rows[line.split("|")[1].strip()], line
