"""The demo: prepare the shipped SQuAD data, evaluate the initial model zero-shot, train a short
CPU-sized run, encode, index, evaluate, and write `results.md` (the report's table and top-k
accuracy plot, `taser.evaluation.report`) with the stage times."""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from pathlib import Path

from taser.data.squad import convert_squad, first_articles
from taser.evaluation.curves import plot_curves, plot_file_name
from taser.evaluation.report import RunResult, markdown_table, read_run
from taser.io import atomic_open
from taser.models.biencoder import read_checkpoint_config
from taser.models.settings import ModelType, TaserConfig
from taser.pipeline.evaluate import evaluate_bm25, evaluate_hybrid
from taser.pipeline.experiment import Row, evaluate_checkpoint, save_initial, train_and_evaluate
from taser.pipeline.jobs import DemoJob
from taser.pipeline.mine import mine_negatives
from taser.retrieval.bm25 import BM25Settings
from taser.runtime import describe_hardware, precision_record

log = logging.getLogger(__name__)

DATASET = "SQuAD"


def _fmt(value, spec: str) -> str:
    return "–" if value is None else format(value, spec)


def report_runs(rows: list[Row]) -> list[RunResult]:
    """The demo's rows as report runs: each row's results.json under the row's name, with its
    training figures as extra columns."""
    runs = []
    for row in rows:
        run = read_run(row.results_file) if row.results_file else RunResult(row.name, DATASET, top_k=row.top_k, parameters=row.parameters)
        run.system, run.dataset = row.name, DATASET
        run.parameters = row.parameters if row.parameters is not None else run.parameters
        run.extra = {"train steps": _fmt(row.train_steps, "d"), "train time (s)": _fmt(row.train_seconds, ".0f"),
                     "s/step": _fmt(row.seconds_per_step, ".2f"), "passages/s": _fmt(row.passages_per_s, ".1f")}
        runs.append(run)
    return runs


def run_demo(cfg: DemoJob) -> str:
    out = Path(cfg.out_dir)
    times: dict[str, float] = {}
    runtime = precision_record(cfg.precision)
    train_runtime = precision_record(cfg.train.precision)
    log.info("demo on %s: training in %s, encoding in %s with PyTorch (backend=torch)", describe_hardware(), train_runtime["precision"],
             runtime["precision"])
    t = time.perf_counter()
    source = cfg.squad_json if cfg.articles is None else first_articles(cfg.squad_json, cfg.articles, out / f"squad-first-{cfg.articles}.json")
    summary = convert_squad(source, out / "data", train_articles=cfg.train_articles)
    times["prepare data"] = time.perf_counter() - t
    data = {
        "passages": str(out / "data" / "passages.tsv"),
        "qa_file": str(out / "data" / "dev.qa.tsv"),
        "train_files": [str(out / "data" / "train.json")],
        "dev_file": str(out / "data" / "dev.json"),
        "match": "string",
    }
    rows: list[Row] = []
    bm25_rows, hard_note = bm25_stages(cfg, out, data, times)
    rows += bm25_rows

    t = time.perf_counter()
    # one encoder for both sides: before training, a DPR pair's two encoders are the same pretrained model, so this gives
    # the same vectors at half the parameters (the figure the README's table gives for zero-shot MiniLM)
    initial = save_initial(replace(cfg.model, model_type=ModelType.shared, taser=TaserConfig()), out / "zero-shot")
    rows.append(evaluate_checkpoint("zero-shot (initial model)", initial, data, out / "zero-shot", precision=cfg.precision))
    times["zero-shot: encode + index + evaluate"] = time.perf_counter() - t

    t = time.perf_counter()
    trained = train_and_evaluate(f"{cfg.model.model_type} trained", cfg.model, cfg.train, data, out / "trained", eval_precision=cfg.precision)
    rows.append(trained)
    times["train"] = trained.stage_seconds["train"]
    times["trained: encode + index + evaluate"] = time.perf_counter() - t - trained.stage_seconds["train"]
    rows += hybrid_stage(cfg, out, data, times, trained=out / "trained")

    tr = cfg.train
    model_config = read_checkpoint_config(out / "trained" / "final")[0]
    runs = report_runs(rows)
    plot = plot_curves(runs, DATASET, out / plot_file_name(DATASET))
    text = (
        "# taser demo: SQuAD benchmark (shipped data), all-MiniLM-L6-v2\n\n"
        f"Corpus: {summary['passages']} passages ({summary['train']['articles'] + summary['dev']['articles']} articles, 100 words); "
        f"evaluation: {summary['dev']['questions']} questions (last {summary['dev']['articles']} articles); "
        f"training: {summary['train']['with_positive']} questions with a positive (first {summary['train']['articles']} articles).\n"
        f"Training: {tr.max_steps} steps of {tr.batch_size} questions + {tr.hard_negatives} {hard_note} hard negative(s) each, "
        f"lr {tr.learning_rate}, {model_config.pooling} pooling"
        f"{', normalised' if model_config.normalize else ''}, {model_config.similarity} similarity.\n"
        f"Machine: {describe_hardware()}; training in {train_runtime['precision']} (precision={tr.precision}), "
        f"encoding in {runtime['precision']} (precision={cfg.precision}) with PyTorch (backend=torch: exact, as training computes).\n\n"
        + markdown_table(runs, ks=(1, 5, 20, 100))
        + (f"\n![top-k accuracy, k = 1..100]({plot.name})\n" if plot else "")
        + "\n## Stage times (s)\n\n| stage | seconds |\n|---|---|\n"
        + "".join(f"| {k} | {v:.1f} |\n" for k, v in times.items())
    )
    with atomic_open(out / "results.md") as f:
        f.write(text)
    return text


def _bm25_settings(cfg: DemoJob, out: Path) -> BM25Settings:
    return replace(cfg.bm25, index_dir=cfg.bm25.index_dir or str(out / "bm25" / "index"))


def bm25_stages(cfg: DemoJob, out: Path, data: dict, times: dict) -> tuple[list[Row], str]:
    """The BM25 baseline row, then BM25 hard negatives for the training questions.

    `data["train_files"]` is replaced by the mined file, so the trained model sees BM25 hard
    negatives. A no-op (random negatives) when BM25 is disabled.
    """
    if not cfg.use_bm25:
        return [], "random"
    settings = _bm25_settings(cfg, out)
    t = time.perf_counter()
    results = evaluate_bm25(data["qa_file"], data["passages"], out / "bm25" / "eval", match=data["match"], bm25=settings)
    seconds = time.perf_counter() - t
    times["BM25: index + evaluate"] = seconds
    engine = "Lucene" if settings.backend == "pyserini" else "bm25s"
    row = Row(f"BM25 ({engine}, k1={settings.k1:g}, b={settings.b:g})", results["top_k"], stage_seconds={"index + evaluate": seconds},
              results_file=str(out / "bm25" / "eval" / "results.json"))

    t = time.perf_counter()
    mined = out / "data" / "train.bm25.json"
    mine_negatives(data["train_files"][0], data["passages"], mined, retriever="bm25", match=data["match"], bm25=settings,
                   progress=cfg.train.progress)
    times["BM25: mine hard negatives"] = time.perf_counter() - t
    data["train_files"] = [str(mined)]
    return [row], "BM25"


def hybrid_stage(cfg: DemoJob, out: Path, data: dict, times: dict, trained: Path | None = None) -> list[Row]:
    """DPR's hybrid: the trained model's and BM25's top-100 fused by bm25 + λ·dense on the dev questions."""
    if not cfg.use_bm25 or trained is None:
        return []
    lam, rule = cfg.hybrid.dense_weight, cfg.hybrid.rule
    t = time.perf_counter()
    results = evaluate_hybrid(trained / "final", trained / "index", data["qa_file"], data["passages"], out / "hybrid",
                              k=100, match=data["match"], bm25=_bm25_settings(cfg, out), lam=lam, rule=rule,
                              candidates=cfg.hybrid.candidates, precision=cfg.precision)
    times["hybrid: retrieve + evaluate"] = time.perf_counter() - t
    return [Row(f"hybrid (BM25 + dense, λ={lam:g})", results["top_k"], stage_seconds={"evaluate": times["hybrid: retrieve + evaluate"]},
                results_file=str(out / "hybrid" / "results.json"))]
