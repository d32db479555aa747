"""The reader's two stages, callable from Python (the scripts only read their configs and call these):

- `train_reader`: a reader trained from a retrieval JSON of training questions;
- `read`: a retrieval JSON answered at each k asked; writes `predictions.json` (per question: its
  question, answers, and per k the prediction, passage id, its rank and scores, EM and F1),
  `per_query.jsonl` (per question: the rank of the first passage holding an answer, and EM@k and
  F1@k, for paired comparisons) and `results.json` (EM and F1 at each k, beside the retriever's
  top-k accuracy on the same questions; the dataset, the retriever's system name and the reader's
  training seed, so that `scripts/report.py` puts EM beside top-k), all atomically.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path

from taser.data.errors import DataFormatError
from taser.evaluation.per_query import PER_QUERY_FILE, write_per_query
from taser.evaluation.runs import RESULTS_FILE, system_name
from taser.io import atomic_open
from taser.progress import progress
from taser.reader.config import ReaderStage, ReadJob, TrainReaderJob
from taser.reader.data import TrainingSet, iter_for_reader, read_for_reader, reading_set, training_set
from taser.reader.gold import read_gold_passages
from taser.reader.model import Reader, load_reader, read_reader_config
from taser.reader.reading import predict, read_passages
from taser.reader.selection import DevSelection
from taser.reader.trainer import ReaderTrainer, ReaderTrainResult
from taser.runtime import pick_device, precision_record
from taser.training.distributed import destroy_distributed, init_distributed
from taser.training.provenance import training_provenance

log = logging.getLogger(__name__)

def new_reader(job: TrainReaderJob):
    """(reader, tokenizer): fresh on `model.pretrained` (its heads drawn from `train.seed`), or
    continued from `model.init_checkpoint`."""
    import torch
    from transformers import AutoTokenizer

    from taser.models.biencoder import load_tokenizer
    from taser.models.pretrained import SHIPPED_MODEL

    m = job.model
    if m.init_checkpoint:
        model = Reader.load(m.init_checkpoint)
        model.config.max_length, model.config.max_question_length = m.max_length, m.max_question_length
        model.config.max_answer_length = m.max_answer_length or model.config.max_answer_length
        tokenizer = AutoTokenizer.from_pretrained(m.init_checkpoint)
    else:
        source = m.pretrained or SHIPPED_MODEL
        torch.manual_seed(job.train.seed)
        model = Reader.from_pretrained(source, m.max_length, m.max_question_length, m.max_answer_length or 10)
        tokenizer = load_tokenizer(source)
    model.set_dropout(m.dropout)
    return model, tokenizer


def training_data(job: TrainReaderJob, tokenizer, config) -> TrainingSet:
    """The stage's training questions: gold passages alone (`reading`), or retrieved passages with
    the gold passage as the positive where `gold_file` knows it (`open_domain`)."""
    lengths = (config.max_length, config.max_question_length)
    if job.train.stage == ReaderStage.reading:
        return reading_set(job.gold_file, tokenizer, *lengths, train_file=job.train_file)
    gold = read_gold_passages(job.gold_file) if job.gold_file else None
    return training_set(job.train_file, tokenizer, job.train.top_n, *lengths, job.match, gold=gold)


def train_reader(job: TrainReaderJob, output_dir: str | None = None) -> ReaderTrainResult:
    dist_info = init_distributed(device=job.train.device)  # the process group follows the training device
    try:
        model, tokenizer = new_reader(job)
        data = training_data(job, tokenizer, model.config)
        out = Path(output_dir or job.output_dir)
        dev = None
        if job.dev_file:
            dev = DevSelection(read_for_reader(job.dev_file, k=job.train.val_passages, max_questions=job.train.val_max_questions),
                               job.train.val_passages, str(job.match), model.config.max_answer_length, 32, out)
        out.mkdir(parents=True, exist_ok=True)
        return ReaderTrainer(model, tokenizer, data, job.train, out, dist_info, dev).train()
    finally:
        if dist_info.started_group:
            destroy_distributed()


def _retrieval_run(retrieval: str) -> dict:
    """The `results.json` that `scripts/evaluate.py` wrote beside a retrieval JSON ({} when there is none)."""
    beside = Path(retrieval).parent / RESULTS_FILE
    if not beside.is_file():
        return {}
    try:
        found = json.loads(beside.read_text(encoding="utf-8"))
    except json.JSONDecodeError:
        log.warning("%s: unreadable; the reader's results name no retriever", beside)
        return {}
    return found if isinstance(found, dict) else {}


def describe_reading(job: ReadJob) -> dict:
    """results.json's identity fields: dataset, retriever, system name (the reader's over the
    retriever's, without the seed) and the reader's training seed."""
    retrieval = _retrieval_run(job.retrieval)
    retriever = system_name(retrieval) if retrieval else Path(job.retrieval).parent.name or Path(job.retrieval).stem
    provenance = training_provenance(job.checkpoint)
    reader = provenance.get("train_name") or "reader"
    return {"dataset": job.dataset or retrieval.get("dataset") or Path(job.retrieval).stem, "retriever": retriever,
            "name": job.name or f"{reader} on {retriever}", "seed": provenance["seed"]}


def _per_query_line(i: int, record: dict, pred: dict, ks: list[int]) -> dict:
    """Question i's line (id: its position in the retrieval JSON, as `evaluate.py`'s per_query ids):
    the rank of the first passage holding an answer, EM@k and F1@k on results.json's scale (%)."""
    rank = next((r + 1 for r, c in enumerate(record["ctxs"][: ks[-1]]) if c.get("has_answer")), None)
    line = {"id": str(i), "rank": rank}
    for k in ks:
        line[f"EM@{k}"] = 100.0 * pred["by_k"][str(k)]["em"]
        line[f"F1@{k}"] = round(100.0 * pred["by_k"][str(k)]["f1"], 4)
    return line


def _chunks(records: Iterator[dict], size: int) -> Iterator[list[dict]]:
    chunk: list[dict] = []
    for record in records:
        chunk.append(record)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


QUESTIONS_PER_CHUNK = 512  # records held at once: the retrieval JSON is streamed, never loaded whole


def read(job: ReadJob) -> dict:
    """Answer `job.retrieval`'s questions at each k of `job.ks`; returns `results.json`'s content.
    Nothing is written before every question is read: bad input stops with no output."""
    ks = list(job.ks)
    read_reader_config(job.checkpoint)  # a wrong directory is refused before the data are read
    device = pick_device(job.device)
    runtime = precision_record(job.precision, device)
    model, tokenizer = load_reader(job.checkpoint)
    max_answer_length = job.max_answer_length or model.config.max_answer_length
    predictions, per_query, passages_read, seconds = [], [], 0, 0.0
    em, f1, top_k = dict.fromkeys(ks, 0.0), dict.fromkeys(ks, 0.0), dict.fromkeys(ks, 0)
    with progress(desc="read", unit="question", enabled=job.progress) as bar:
        for chunk in _chunks(iter_for_reader(job.retrieval, k=max(ks), max_questions=job.max_questions), QUESTIONS_PER_CHUNK):
            start = time.perf_counter()
            passages = read_passages(model, tokenizer, chunk, max(ks), max_answer_length, job.batch_size, runtime["precision"], device,
                                     show_progress=False)
            seconds += time.perf_counter() - start
            passages_read += sum(len(p) for p in passages)
            for record, read_list in zip(chunk, passages):
                by_k = {}
                for k in ks:
                    by_k[str(k)] = pred = predict(record, read_list, k, job.match)
                    em[k] += pred["em"]
                    f1[k] += pred["f1"]
                    top_k[k] += any(c.get("has_answer") for c in record["ctxs"][:k])
                last = by_k[str(ks[-1])]
                predictions.append({"question": record["question"], "answers": record["answers"], "prediction": last["prediction"],
                                    "passage_id": last["passage_id"], "score": last["score"], "by_k": by_k})
                per_query.append(_per_query_line(len(per_query), record, predictions[-1], ks))
            bar.update(len(chunk))
    n = len(predictions)
    if not n:
        raise DataFormatError(job.retrieval, "top level", "no records: nothing to read")
    results = {
        "task": "reader", **describe_reading(job), "reader": str(job.checkpoint), "retrieval": str(job.retrieval), "questions": n,
        "ks": ks, "match": str(job.match), "max_answer_length": max_answer_length,
        "em": {str(k): 100 * em[k] / n for k in ks}, "f1": {str(k): 100 * f1[k] / n for k in ks},
        "top_k": {str(k): 100 * top_k[k] / n for k in ks},  # the retriever's accuracy (ctxs' has_answer) on the same questions
        "seconds": seconds, "passages_per_s": passages_read / max(seconds, 1e-9), **runtime, "per_query_file": PER_QUERY_FILE,
    }  # fmt: skip
    out = Path(job.out_dir)
    with atomic_open(out / "predictions.json") as f:
        json.dump(predictions, f, indent=2, ensure_ascii=False)
    write_per_query(out / PER_QUERY_FILE, per_query)
    with atomic_open(out / RESULTS_FILE) as f:
        json.dump(results, f, indent=2)
    log.info("%s: %d questions: %s", job.retrieval, n, format_scores(results))
    return results


def format_scores(results: dict) -> str:
    return "  ".join(f"EM@{k} {results['em'][str(k)]:.1f} (F1 {results['f1'][str(k)]:.1f})" for k in results["ks"])
