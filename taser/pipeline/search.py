"""Search your own texts: a corpus (DPR passages TSV, JSONL or a BEIR directory), queries without
answers, and a retriever (a checkpoint, trained or released; BM25; or both fused), giving rankings
as a TREC run and as JSON lines with the passages' texts.

    from taser import Searcher
    searcher = Searcher("my-corpus.jsonl", checkpoint="facebook/dpr-question_encoder-single-nq-base")
    rankings = searcher.search({"q1": "who wrote the origin of species"}, k=10)
    searcher.write(rankings, "outputs/search/run")

What is built once is kept under `work_dir` and reused while its inputs are unchanged: a converted
corpus, each checkpoint's flat index of the corpus (`taser.pipeline.evaluate.dense_index`), the
BM25 index."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from taser.data.corpus import passages_tsv
from taser.data.passages import read_passages
from taser.data.trec import write_trec_run
from taser.io import atomic_open
from taser.pipeline.evaluate import Retriever, RetrieverSettings, retrieve
from taser.pipeline.released import resolve_checkpoint
from taser.retrieval.bm25 import BM25Settings

log = logging.getLogger(__name__)

Ranking = dict[str, list[tuple[str, float]]]  # query id -> (passage id, score), best first


class Searcher:
    """A corpus and a retriever, ready to rank any queries against the corpus.

    `retriever`: dense (needs `checkpoint`), bm25, or hybrid (both; `lam` weighs the dense score, DPR's
    rule). `checkpoint`: a taser checkpoint directory or a released model's hub name
    (`taser.pipeline.released.RELEASED`; a pickled release needs `allow_pickle=True`)."""

    def __init__(self, corpus: str | os.PathLike, checkpoint: str | os.PathLike | None = None, retriever: str = "dense",
                 work_dir: str | os.PathLike = "outputs/search/cache", bm25: BM25Settings | dict | None = None, lam: float | None = None,
                 batch_size: int = 128, precision: str = "auto", device: str = "auto", allow_pickle: bool = False):
        self.retriever = Retriever.parse(retriever, "retriever")
        if self.retriever != Retriever.bm25 and checkpoint is None:
            raise ValueError(f"retriever={self.retriever} needs a checkpoint (a directory or a released model's hub name)")
        self.work_dir = Path(work_dir)
        self.checkpoint = resolve_checkpoint(checkpoint, allow_pickle) if checkpoint is not None and self.retriever != Retriever.bm25 else None
        self.passages = passages_tsv(corpus, self.work_dir)  # checked (and converted) before any model loads
        extra = {"lam": lam} if lam is not None else {}
        self.settings = RetrieverSettings(self.retriever, checkpoint=self.checkpoint, bm25=bm25 or BM25Settings(), batch_size=batch_size,
                                          precision=precision, device=device, **extra)
        if self.settings.bm25.index_dir is None:  # one BM25 index of the corpus, whichever checkpoint it is fused with
            self.settings.bm25.index_dir = str(self.work_dir / "bm25-index")

    def _retrieval_dir(self) -> Path:
        """Where this retriever's indexes live: the BM25 index is shared by every checkpoint; a dense index is one per checkpoint."""
        if self.checkpoint is None:
            return self.work_dir
        key = hashlib.sha256(str(Path(self.checkpoint).resolve()).encode()).hexdigest()[:12]
        return self.work_dir / f"{Path(self.checkpoint).name}-{key}"

    def search(self, queries: Mapping[str, str] | Sequence[str], k: int = 100) -> Ranking:
        """{query id: [(passage id, score), ...]} of the top `k`, best first; a list of texts gets ids q1, q2, ..."""
        if not isinstance(queries, Mapping):
            queries = {f"q{i}": text for i, text in enumerate(queries, start=1)}
        if not queries:
            return {}
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        retrieved, self.meta = retrieve(self.settings, list(queries.values()), self.passages, k, self._retrieval_dir())
        return dict(zip(queries, retrieved))

    def write(self, rankings: Ranking, out_dir: str | os.PathLike, queries: Mapping[str, str] | None = None, tag: str = "taser") -> dict[str, Path]:
        """`run.trec` (TREC's run format: `qid Q0 docid rank score tag`) and `rankings.jsonl` (per query: its text when
        given, and each hit's rank, id, score, title and text) in `out_dir`, each written whole or not at all."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        write_trec_run(out / "run.trec", rankings, tag)
        needed = {pid for hits in rankings.values() for pid, _ in hits}
        texts = {p.id: p for p in read_passages(self.passages) if p.id in needed}
        with atomic_open(out / "rankings.jsonl") as f:
            for qid, hits in rankings.items():
                record = {"query_id": qid, **({"query": queries[qid]} if queries and qid in queries else {}),
                          "hits": [{"rank": rank, "id": pid, "score": float(score), "title": texts[pid].title, "text": texts[pid].text}
                                   for rank, (pid, score) in enumerate(hits, start=1)]}
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
        return {"trec": out / "run.trec", "jsonl": out / "rankings.jsonl"}
