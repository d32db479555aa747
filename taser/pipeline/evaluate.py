"""Stage: retrieve top-k passages for a QA file and evaluate top-k accuracy."""

from __future__ import annotations

import logging
import os
import time

from taser.data.qa import read_qa
from taser.evaluation.retrieval_eval import evaluate_retrieval
from taser.models.biencoder import BiEncoder, load_tokenizer
from taser.models.params import parameter_report
from taser.retrieval.encoder import encode_questions, pick_device
from taser.retrieval.faiss_index import PassageIndex

log = logging.getLogger(__name__)


def dense_retrieve(model, tokenizer, index: PassageIndex, questions: list[str], k: int, batch_size: int = 128, precision: str = "fp32"):
    vectors = encode_questions(model, tokenizer, questions, batch_size=batch_size, precision=precision)
    scores, ids = index.search(vectors, k)
    return [list(zip(row_ids, map(float, row_scores))) for row_ids, row_scores in zip(ids, scores)]


def evaluate_dense(
    checkpoint: str | os.PathLike,
    index_dir: str | os.PathLike,
    qa_file: str | os.PathLike,
    passages_tsv: str | os.PathLike,
    out_dir: str | os.PathLike,
    k: int = 100,
    match: str = "string",
    batch_size: int = 128,
    precision: str = "fp32",
    device: str = "auto",
) -> dict:
    qa = list(read_qa(qa_file))
    model = BiEncoder.load(checkpoint).to(pick_device(device))
    tokenizer = load_tokenizer(checkpoint)
    index = PassageIndex.load(index_dir)
    start = time.perf_counter()
    retrieved = dense_retrieve(model, tokenizer, index, [q.question for q in qa], k, batch_size, precision)
    seconds = time.perf_counter() - start
    meta = {
        "retriever": "dense",
        "model": str(checkpoint),
        "model_type": model.config.model_type,
        "pretrained": model.config.pretrained,
        "parameters": parameter_report(model)["total"],
        "questions_per_s": round(len(qa) / seconds, 2),
    }
    results = evaluate_retrieval(qa, retrieved, passages_tsv, out_dir, match, meta=meta)
    log.info("%s: %s", qa_file, results["summary"])
    return results
