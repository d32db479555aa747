"""The demo: prepare the shipped SQuAD data, evaluate the initial model zero-shot, train a short
CPU-sized run, encode, index, evaluate, and write `results.md` with the stage times."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from taser.data.squad import convert_squad
from taser.io import atomic_open
from taser.pipeline.experiment import Row, evaluate_checkpoint, markdown_table, save_initial, train_and_evaluate

log = logging.getLogger(__name__)


def run_demo(cfg: dict) -> str:
    out = Path(cfg["out_dir"])
    times: dict[str, float] = {}
    t = time.perf_counter()
    summary = convert_squad(cfg["squad_json"], out / "data")
    times["prepare data"] = time.perf_counter() - t
    data = {
        "passages": str(out / "data" / "passages.tsv"),
        "qa_file": str(out / "data" / "dev.qa.tsv"),
        "train_files": [str(out / "data" / "train.json")],
        "dev_file": str(out / "data" / "dev.json"),
        "match": "string",
    }
    rows: list[Row] = []
    extra_rows, hard_note = bm25_stages(cfg, out, data, times)
    rows += extra_rows[:1]

    t = time.perf_counter()
    initial = save_initial(cfg["model"], out / "zero-shot")
    rows.append(evaluate_checkpoint("zero-shot (initial model)", initial, data, out / "zero-shot", precision=cfg["precision"]))
    times["zero-shot: encode + index + evaluate"] = time.perf_counter() - t

    t = time.perf_counter()
    trained = train_and_evaluate(f"{cfg['model']['model_type']} trained", cfg["model"], cfg["train"], data, out / "trained", eval_precision=cfg["precision"])
    rows.append(trained)
    times["train"] = trained.stage_seconds["train"]
    times["trained: encode + index + evaluate"] = time.perf_counter() - t - trained.stage_seconds["train"]
    rows += hybrid_stage(cfg, out, data, times)

    tr = cfg["train"]
    text = (
        "# taser demo: SQuAD benchmark (shipped data), all-MiniLM-L6-v2\n\n"
        f"Corpus: {summary['passages']} passages (40 articles, 100 words); evaluation: {summary['dev']['questions']} questions "
        f"(last 10 articles); training: {summary['train']['with_positive']} questions with a positive (first 30 articles).\n"
        f"Training: {tr['max_steps']} steps of {tr['batch_size']} questions + {tr['hard_negatives']} {hard_note} hard negative(s) each, "
        f"lr {tr['learning_rate']}, precision {cfg['precision']}, pooling {cfg['model'].get('pooling')}.\n\n"
        + markdown_table(rows)
        + "\n## Stage times (s)\n\n| stage | seconds |\n|---|---|\n"
        + "".join(f"| {k} | {v:.1f} |\n" for k, v in times.items())
    )
    with atomic_open(out / "results.md") as f:
        f.write(text)
    return text


def bm25_stages(cfg: dict, out: Path, data: dict, times: dict) -> tuple[list[Row], str]:
    """BM25 baseline row and hard-negative mining; a no-op until BM25 is enabled."""
    return [], "random"


def hybrid_stage(cfg: dict, out: Path, data: dict, times: dict) -> list[Row]:
    return []
