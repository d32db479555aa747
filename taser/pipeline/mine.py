"""Stage: mine hard negatives (and distant positives) with BM25 or a dense checkpoint.

Passage texts for the mined ctxs come from a `PassageStore` over the passages TSV, for every
retriever: one code path, bounded memory, and the exact title and text of the TSV. (The Lucene
index stores no raw documents; storing them would roughly double its size on a 21M corpus.)
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from taser.data.passage_store import PassageStore
from taser.retrieval.bm25 import BM25Settings
from taser.retrieval.mining import bm25_searcher, dense_searcher, mine_hard_negatives, retrieval_searcher

log = logging.getLogger(__name__)

RETRIEVERS = ("bm25", "dense", "retrieval")


def mine_negatives(
    input_path: str | os.PathLike,
    passages_tsv: str | os.PathLike,
    output_path: str | os.PathLike,
    retriever: str = "bm25",
    top_n: int = 100,
    num_hard_negatives: int = 30,
    match: str = "string",
    bm25: BM25Settings | dict | None = None,
    checkpoint: str | os.PathLike | None = None,
    index: str | os.PathLike | None = None,
    retrieval: str | os.PathLike | None = None,
    retrieved_k: int | None = None,
    batch_size: int = 128,
    precision: str = "auto",
    backend: str = "torch",
    device: str = "auto",
    block_size: int = 1000,
    offsets_cache: str | os.PathLike | None = None,
    progress: bool = True,
    distant_positives: bool = False,
) -> dict:
    """Write `output_path`: the questions of `input_path` with mined `hard_negative_ctxs` (and with
    `distant_positives`, each question's positive replaced by its retriever's best answer-bearing passage).

    retriever="bm25": a BM25 index of `passages_tsv` (built, or reused from `bm25.index_dir`;
    default `<output dir>/bm25-<backend>`). retriever="dense": `checkpoint` and its FAISS
    `index` over `passages_tsv`. retriever="retrieval": the rankings of a retrieval already made over
    `passages_tsv` (`retrieval`, DPR's retrieval JSON of the same questions in the same order, the top
    `retrieved_k` of each: a table's `retrieve-train` stage). `offsets_cache`: where to keep the passage store's offsets
    (worth it for a large corpus). Returns the summary (also written beside the output).
    """
    if retriever not in RETRIEVERS:
        raise ValueError(f"unknown retriever {retriever!r} for mining; choose one of {', '.join(RETRIEVERS)}")
    if retriever == "dense" and (not checkpoint or not index):
        raise ValueError("retriever=dense needs a checkpoint and its passage index")
    if retriever == "retrieval" and (not retrieval or not retrieved_k):
        raise ValueError("retriever=retrieval needs the retrieval file and how many passages it holds per question (retrieved_k)")
    with PassageStore(passages_tsv, cache=offsets_cache) as store:
        if retriever == "retrieval":
            meta = {"retriever": "retrieval", "retrieval": str(retrieval), "retrieved_k": retrieved_k}
            return mine_hard_negatives(input_path, output_path, retrieval_searcher(retrieval, retrieved_k), store, top_n, num_hard_negatives,
                                       match, block_size, progress, meta=meta, distant_positives=distant_positives)
        if retriever == "bm25":
            settings = BM25Settings.from_dict(bm25)
            bm25_index = settings.open(passages_tsv, Path(output_path).parent / f"bm25-{settings.backend}")
            try:
                return mine_hard_negatives(
                    input_path, output_path, bm25_searcher(bm25_index, settings.threads), store, top_n,
                    num_hard_negatives, match, block_size, progress, meta={"retriever": "bm25", **settings.describe(bm25_index)},
                    distant_positives=distant_positives,
                )
            finally:
                bm25_index.close()
        from taser.models.encoding import encoding_runtime
        from taser.models.loading import load_checkpoint
        from taser.retrieval.faiss_index import load_index

        model, tokenizer = load_checkpoint(checkpoint, device, backend)
        runtime = encoding_runtime(model, precision)
        search = dense_searcher(model, tokenizer, load_index(index), batch_size, runtime["precision"])
        meta = {"retriever": "dense", "model": str(checkpoint), "index": str(index), **runtime}
        return mine_hard_negatives(input_path, output_path, search, store, top_n, num_hard_negatives, match,
                                   block_size, progress, meta=meta, distant_positives=distant_positives)
