"""Stage: build a FAISS index from encoded passage shards, adding them chunk by chunk.

Peak memory is the index plus one chunk (plus the training sample for types that train): the
shards are never concatenated. The shards' manifests are checked first (every passage once,
one checkpoint, one passages file), so ids cannot repeat.
"""

from __future__ import annotations

import logging
import os
import time

from taser.retrieval.embeddings import iter_chunks, read_manifests
from taser.retrieval.faiss_index import PassageIndex, part_dir
from taser.retrieval.index_types import IndexConfig

log = logging.getLogger(__name__)


def build_index(embeddings: str | os.PathLike, out_dir: str | os.PathLike, config: IndexConfig) -> dict:
    start = time.perf_counter()
    manifests = read_manifests(embeddings)
    count, dim = manifests[-1]["end"], manifests[0]["dim"]
    meta = {"checkpoint": manifests[0]["checkpoint"], "passages": manifests[0]["passages"]}
    index = PassageIndex.build_streamed(lambda: iter_chunks(embeddings, manifests), count, dim, config, meta)
    if config.part is not None:  # one part per process: the others are written beside it by their own processes
        out_dir = part_dir(out_dir, config.part)
    index.save(out_dir)
    elapsed = time.perf_counter() - start
    log.info("built a %s index of %d passages in %.1fs at %s", index.config.type, count, elapsed, out_dir)
    return {"passages": count, "seconds": elapsed, "type": str(index.config.type)}
