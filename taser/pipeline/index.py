"""Stage: build a FAISS index from encoded passage shards, adding them chunk by chunk.

Peak memory is the index plus one chunk (plus the training sample for types that train): the
shards are never concatenated. The shards' manifests are checked first (every passage once,
one checkpoint, one passages file), so ids cannot repeat.
"""

from __future__ import annotations

import itertools
import logging
import os
import time

from taser.models.backends import recorded_backend
from taser.progress import progress
from taser.retrieval.embeddings import iter_chunks, read_manifests
from taser.retrieval.faiss_index import PassageIndex, part_dir
from taser.retrieval.index_types import IndexConfig

log = logging.getLogger(__name__)


def _shown(chunks, count: int):
    """`chunks` (a fresh pass over the vectors each call) with a progress bar per pass: types that
    train read the vectors twice (the training sample, then the adding)."""
    passes = itertools.count(1)

    def each_pass():
        with progress(total=count, desc=f"build index: pass {next(passes)} over the vectors", unit="vector") as bar:
            for vectors, ids in chunks():
                yield vectors, ids
                bar.update(len(vectors))

    return each_pass


def build_index(embeddings: str | os.PathLike, out_dir: str | os.PathLike, config: IndexConfig) -> dict:
    start = time.perf_counter()
    manifests = read_manifests(embeddings)
    count, dim = manifests[-1]["end"], manifests[0]["dim"]
    meta = {"checkpoint": manifests[0]["checkpoint"], "passages": manifests[0]["passages"],
            **recorded_backend(manifests[0])}  # vectors not from torch say so
    index = PassageIndex.build_streamed(_shown(lambda: iter_chunks(embeddings, manifests), count), count, dim, config, meta)
    if config.part is not None:  # one part per process: the others are written beside it by their own processes
        out_dir = part_dir(out_dir, config.part)
    index.save(out_dir)
    elapsed = time.perf_counter() - start
    log.info("built a %s index of %d passages in %.1fs at %s", index.config.type, count, elapsed, out_dir)
    return {"passages": count, "seconds": elapsed, "type": str(index.config.type)}
