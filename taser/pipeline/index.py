"""Stage: build a FAISS index from encoded passage shards."""

from __future__ import annotations

import logging
import os
import time

from taser.retrieval.embeddings import read_embeddings
from taser.retrieval.faiss_index import IndexConfig, PassageIndex

log = logging.getLogger(__name__)


def build_index(embeddings: str | os.PathLike, out_dir: str | os.PathLike, config: IndexConfig) -> dict:
    start = time.perf_counter()
    vectors, ids = read_embeddings(embeddings)
    if len(set(ids)) != len(ids):
        raise ValueError(f"{embeddings}: duplicate passage ids across shards")
    index = PassageIndex.build(vectors, ids, config)
    index.save(out_dir)
    elapsed = time.perf_counter() - start
    log.info("built a %s index of %d passages in %.1fs at %s", config.type, len(ids), elapsed, out_dir)
    return {"passages": len(ids), "seconds": elapsed}
