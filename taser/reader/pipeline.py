"""The reader's two stages, callable from Python (the scripts only read their configs and call these):

- `train_reader`: a reader trained from a retrieval JSON of training questions;
- `read`: a retrieval JSON answered at each k asked; writes `predictions.json` (per question: its
  question, answers, and per k the prediction, passage id, its rank and scores, EM and F1) and
  `results.json` (EM and F1 at each k, beside the retriever's top-k accuracy on the same
  questions), both atomically.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from taser.io import atomic_open
from taser.reader.config import ReadJob, TrainReaderJob
from taser.reader.data import read_for_reader, training_set
from taser.reader.metrics import score_prediction
from taser.reader.model import Reader, load_reader, read_reader_config
from taser.reader.reading import choose, read_passages
from taser.reader.trainer import ReaderTrainer, ReaderTrainResult
from taser.runtime import pick_device, precision_record
from taser.training.distributed import destroy_distributed, init_distributed

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
        tokenizer = AutoTokenizer.from_pretrained(m.init_checkpoint)
    else:
        source = m.pretrained or SHIPPED_MODEL
        torch.manual_seed(job.train.seed)
        model = Reader.from_pretrained(source, m.max_length, m.max_question_length)
        tokenizer = load_tokenizer(source)
    model.set_dropout(m.dropout)
    return model, tokenizer


def train_reader(job: TrainReaderJob, output_dir: str | None = None) -> ReaderTrainResult:
    dist_info = init_distributed()
    try:
        model, tokenizer = new_reader(job)
        data = training_set(job.train_file, tokenizer, job.train.top_n, model.config.max_length, model.config.max_question_length, job.match)
        out = Path(output_dir or job.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        return ReaderTrainer(model, tokenizer, data, job.train, out, dist_info).train()
    finally:
        if dist_info.started_group:
            destroy_distributed()


def _prediction(record: dict, read, index: int | None, match: str) -> dict:
    if index is None:
        answer, ctx, p = "", {}, None
    else:
        p, ctx = read[index], record["ctxs"][index]
        answer = p.answer
    em, f1 = score_prediction(answer, record["answers"], match)
    return {"prediction": answer, "passage_id": ctx.get("id"), "passage_rank": None if index is None else index + 1,
            "score": None if p is None else p.relevance, "span_score": None if p is None else p.span.score,
            "char_start": None if p is None else p.char_start, "char_end": None if p is None else p.char_end, "em": em, "f1": f1}


def read(job: ReadJob) -> dict:
    """Answer `job.retrieval`'s questions at each k of `job.ks`; returns `results.json`'s content."""
    ks = list(job.ks)
    read_reader_config(job.checkpoint)  # a wrong directory is refused before the data are read
    records = read_for_reader(job.retrieval, k=max(ks), max_questions=job.max_questions)
    device = pick_device(job.device)
    runtime = precision_record(job.precision, device)
    model, tokenizer = load_reader(job.checkpoint)
    start = time.perf_counter()
    passages = read_passages(model, tokenizer, records, max(ks), job.max_answer_length, job.batch_size, runtime["precision"], device,
                             job.progress)
    seconds = time.perf_counter() - start
    predictions, em, f1, top_k = [], dict.fromkeys(ks, 0.0), dict.fromkeys(ks, 0.0), dict.fromkeys(ks, 0)
    for record, read_list in zip(records, passages):
        by_k = {}
        for k in ks:
            by_k[str(k)] = pred = _prediction(record, read_list, choose(read_list, k), job.match)
            em[k] += pred["em"]
            f1[k] += pred["f1"]
            top_k[k] += any(c.get("has_answer") for c in record["ctxs"][:k])
        last = by_k[str(ks[-1])]
        predictions.append({"question": record["question"], "answers": record["answers"], "prediction": last["prediction"],
                            "passage_id": last["passage_id"], "score": last["score"], "by_k": by_k})
    n = len(records)
    results = {
        "task": "reader", "name": job.name or Path(job.checkpoint).name, "reader": str(job.checkpoint), "retrieval": str(job.retrieval),
        "questions": n, "ks": ks, "match": str(job.match), "max_answer_length": job.max_answer_length,
        "em": {str(k): 100 * em[k] / n for k in ks}, "f1": {str(k): 100 * f1[k] / n for k in ks},
        "top_k": {str(k): 100 * top_k[k] / n for k in ks},  # the retriever's accuracy (ctxs' has_answer) on the same questions
        "seconds": seconds, "passages_per_s": sum(len(p) for p in passages) / max(seconds, 1e-9), **runtime,
    }  # fmt: skip
    out = Path(job.out_dir)
    with atomic_open(out / "predictions.json") as f:
        json.dump(predictions, f, indent=2, ensure_ascii=False)
    with atomic_open(out / "results.json") as f:
        json.dump(results, f, indent=2)
    log.info("%s: EM %s", job.retrieval, format_scores(results))
    return results


def format_scores(results: dict) -> str:
    return "  ".join(f"EM@{k} {results['em'][str(k)]:.1f} (F1 {results['f1'][str(k)]:.1f})" for k in results["ks"])
