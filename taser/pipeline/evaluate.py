"""Stage: retrieve top-k passages for a QA file (dense, BM25 or hybrid) and evaluate top-k accuracy.

Every retriever ends in `evaluate_retrieval`, so all write the same DPR retrieval JSON and a
`results.json` naming the retriever and its settings.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from taser.data.qa import read_qa
from taser.evaluation.retrieval_eval import evaluate_retrieval
from taser.retrieval.bm25 import BM25Settings
from taser.retrieval.hybrid import DPR_LAMBDA, fuse_many

# torch, transformers and faiss are imported only by the dense paths: BM25 alone starts fast.

log = logging.getLogger(__name__)


def _dense_results(checkpoint, index_dir, passages_tsv, questions: list[str], k: int, batch_size: int, precision: str,
                   device: str) -> tuple[list, dict, float]:
    """(results, meta, seconds) of a checkpoint's dense retrieval."""
    from taser.models.loading import load_checkpoint
    from taser.models.params import parameter_report
    from taser.retrieval.dense import dense_retrieve
    from taser.retrieval.embeddings import check_same_passages
    from taser.retrieval.faiss_index import load_index
    from taser.runtime import precision_record

    model, tokenizer = load_checkpoint(checkpoint, device)
    runtime = precision_record(precision, next(model.parameters()).device)
    index = load_index(index_dir)
    check_same_passages(index.meta.get("passages"), passages_tsv, f"the index {index_dir}")
    start = time.perf_counter()
    retrieved = dense_retrieve(model, tokenizer, index, questions, k, batch_size, runtime["precision"])
    seconds = time.perf_counter() - start
    meta = {
        "model": str(checkpoint),
        "model_type": model.config.model_type,
        "pretrained": model.config.pretrained,
        "parameters": parameter_report(model)["total"],
        **runtime,
    }
    return retrieved, meta, seconds


def _questions_per_s(questions: int, seconds: float) -> float:
    return round(questions / max(seconds, 1e-9), 2)


def _bm25_results(passages_tsv, questions: list[str], k: int, bm25, default_dir) -> tuple[list, dict, float]:
    """(results, meta, seconds) of BM25 retrieval; the index is built once, then reused."""
    settings = BM25Settings.from_dict(bm25)
    index = settings.open(passages_tsv, default_dir)
    try:
        start = time.perf_counter()
        retrieved = index.batch_search(questions, k, settings.threads)
        seconds = time.perf_counter() - start
    finally:
        index.close()
    return retrieved, settings.describe(index), seconds


def evaluate_dense(
    checkpoint: str | os.PathLike,
    index_dir: str | os.PathLike,
    qa_file: str | os.PathLike,
    passages_tsv: str | os.PathLike,
    out_dir: str | os.PathLike,
    k: int = 100,
    match: str = "string",
    batch_size: int = 128,
    precision: str = "auto",
    device: str = "auto",
) -> dict:
    qa = list(read_qa(qa_file))
    retrieved, meta, seconds = _dense_results(checkpoint, index_dir, passages_tsv, [q.question for q in qa], k, batch_size, precision, device)
    meta = {"retriever": "dense", **meta, "questions_per_s": _questions_per_s(len(qa), seconds)}
    results = evaluate_retrieval(qa, retrieved, passages_tsv, out_dir, match, meta=meta)
    log.info("%s: %s", qa_file, results["summary"])
    return results


def evaluate_bm25(
    qa_file: str | os.PathLike,
    passages_tsv: str | os.PathLike,
    out_dir: str | os.PathLike,
    k: int = 100,
    match: str = "string",
    bm25: BM25Settings | dict | None = None,
) -> dict:
    """BM25's top-k accuracy. `bm25`: backend, k1, b, index_dir (default `<out_dir>/bm25-index`), threads."""
    qa = list(read_qa(qa_file))
    retrieved, meta, seconds = _bm25_results(passages_tsv, [q.question for q in qa], k, bm25, Path(out_dir) / "bm25-index")
    meta = {"retriever": "bm25", "bm25": meta, "questions_per_s": _questions_per_s(len(qa), seconds)}
    results = evaluate_retrieval(qa, retrieved, passages_tsv, out_dir, match, meta=meta)
    log.info("%s (BM25 %s): %s", qa_file, meta["bm25"]["backend"], results["summary"])
    return results


def evaluate_hybrid(
    checkpoint: str | os.PathLike,
    index_dir: str | os.PathLike,
    qa_file: str | os.PathLike,
    passages_tsv: str | os.PathLike,
    out_dir: str | os.PathLike,
    k: int = 100,
    match: str = "string",
    bm25: BM25Settings | dict | None = None,
    lam: float = DPR_LAMBDA,
    rule: str = "dpr",
    candidates: int | None = None,
    batch_size: int = 128,
    precision: str = "auto",
    device: str = "auto",
) -> dict:
    """Top-k accuracy of BM25 fused with a dense checkpoint (`taser.retrieval.hybrid`).

    Each retriever returns its top-`candidates` (default k); their union is reranked by `rule`
    with weight `lam` on the dense score, and the first k are judged.
    """
    qa = list(read_qa(qa_file))
    questions = [q.question for q in qa]
    n = candidates or k
    dense, dense_meta, dense_seconds = _dense_results(checkpoint, index_dir, passages_tsv, questions, n, batch_size, precision, device)
    sparse, bm25_meta, bm25_seconds = _bm25_results(passages_tsv, questions, n, bm25, Path(out_dir) / "bm25-index")
    start = time.perf_counter()
    fused = fuse_many(sparse, dense, lam, rule, k)
    seconds = dense_seconds + bm25_seconds + time.perf_counter() - start
    meta = {"retriever": "hybrid", "rule": rule, "lambda": lam, "candidates": n, **dense_meta, "bm25": bm25_meta,
            "questions_per_s": _questions_per_s(len(qa), seconds)}
    results = evaluate_retrieval(qa, fused, passages_tsv, out_dir, match, meta=meta)
    log.info("%s (hybrid, %s, λ=%g): %s", qa_file, rule, lam, results["summary"])
    return results
