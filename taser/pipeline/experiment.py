"""Chains of stages used by the demo and the benchmarks: evaluate a checkpoint on a corpus
(encode -> index -> retrieve -> top-k), train then evaluate, and the markdown table of results."""

from __future__ import annotations

import logging
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from taser.models.biencoder import read_checkpoint_config
from taser.models.loading import load_model
from taser.pipeline.encode import encode_corpus
from taser.pipeline.evaluate import evaluate_dense
from taser.pipeline.index import build_index
from taser.pipeline.train import run_training
from taser.retrieval.faiss_index import metric_for
from taser.retrieval.index_types import IndexConfig

log = logging.getLogger(__name__)


@dataclass
class Row:
    name: str
    top_k: dict[str, float]
    parameters: int | None = None
    train_seconds: float | None = None
    train_steps: int | None = None
    seconds_per_step: float | None = None
    passages_per_s: float | None = None
    stage_seconds: dict[str, float] = field(default_factory=dict)
    results_file: str | None = None  # the evaluation's results.json (for the report)


def save_initial(model_cfg: dict, out_dir: str | Path) -> str:
    """The untrained bi-encoder as a checkpoint (the zero-shot baseline)."""
    model, tokenizer = load_model(model_cfg)
    path = Path(out_dir) / "initial"
    model.save(path, tokenizer)
    return str(path)


def evaluate_checkpoint(
    name: str, checkpoint: str, data: dict, out_dir: str | Path, precision: str = "auto", batch_size: int = 64, index: IndexConfig | None = None
) -> Row:
    out = Path(out_dir)
    times = {}
    t = time.perf_counter()
    shutil.rmtree(out / "embeddings", ignore_errors=True)  # this stage's scratch: never resume another model's vectors
    enc = encode_corpus(checkpoint, data["passages"], out / "embeddings", 0, 1, batch_size=batch_size, precision=precision)  # a line every 30 s in a log
    times["encode"] = time.perf_counter() - t
    t = time.perf_counter()
    similarity = read_checkpoint_config(checkpoint)[0].similarity
    build_index(out / "embeddings", out / "index", index or IndexConfig("flat", metric_for(similarity)))
    times["index"] = time.perf_counter() - t
    t = time.perf_counter()
    results = evaluate_dense(checkpoint, out / "index", data["qa_file"], data["passages"], out / "eval", match=data.get("match", "string"), precision=precision)
    times["evaluate"] = time.perf_counter() - t
    return Row(name, results["top_k"], results["parameters"], passages_per_s=enc["passages_per_s"], stage_seconds=times,
               results_file=str(out / "eval" / "results.json"))


def train_and_evaluate(name: str, model_cfg: dict, train_cfg: dict, data: dict, out_dir: str | Path, eval_precision: str = "auto") -> Row:
    out = Path(out_dir)
    t = time.perf_counter()
    result = run_training(model_cfg, data["train_files"], train_cfg, out, dev_file=data.get("dev_file"))
    train_seconds = time.perf_counter() - t
    row = evaluate_checkpoint(name, result.final_dir, data, out, precision=eval_precision)
    row.train_seconds, row.train_steps, row.seconds_per_step = train_seconds, result.steps, result.seconds_per_step
    row.stage_seconds = {"train": train_seconds, **row.stage_seconds}
    return row


def _fmt(value, spec: str) -> str:
    return "–" if value is None else format(value, spec)


def markdown_table(rows: list[Row], ks=("1", "5", "20", "100")) -> str:
    head = "| model | " + " | ".join(f"top-{k}" for k in ks) + " | parameters | train steps | train time (s) | s/step | passages/s |"
    lines = [head, "|" + "---|" * (len(ks) + 6)]
    for r in rows:
        cells = [
            r.name,
            *(_fmt(r.top_k.get(k), ".1f") for k in ks),
            _fmt(r.parameters, ","),
            _fmt(r.train_steps, "d"),
            _fmt(r.train_seconds, ".0f"),
            _fmt(r.seconds_per_step, ".2f"),
            _fmt(r.passages_per_s, ".1f"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
