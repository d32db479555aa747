"""Stage: encode a passages TSV with the passage side of a checkpoint, one shard at a time."""

from __future__ import annotations

import itertools
import logging
import os
import time

import numpy as np

from taser.data.passages import read_passages
from taser.models.encoding import encode_passages
from taser.models.loading import load_checkpoint
from taser.retrieval.embeddings import save_shard, shard_path
from taser.runtime import describe_hardware, precision_record

log = logging.getLogger(__name__)


def encode_corpus(
    checkpoint: str | os.PathLike,
    passages_tsv: str | os.PathLike,
    out_dir: str | os.PathLike,
    shard_id: int = 0,
    num_shards: int = 1,
    batch_size: int = 64,
    precision: str = "auto",
    chunk_size: int = 100_000,
    device: str = "auto",
    progress: bool = True,
) -> dict:
    """Encode every `num_shards`-th passage starting at `shard_id`; write one `.npz` shard.

    Passages are read in chunks of `chunk_size` so memory stays bounded on a 21M-passage corpus.
    """
    if not 0 <= shard_id < num_shards:
        raise ValueError(f"shard_id must be in 0..{num_shards - 1}, got {shard_id}")
    model, tokenizer = load_checkpoint(checkpoint, device)
    runtime = precision_record(precision, next(model.parameters()).device)
    log.info("encoding in %s (precision=%s) on %s", runtime["precision"], precision, describe_hardware(next(model.parameters()).device))
    mine = (p for i, p in enumerate(read_passages(passages_tsv)) if i % num_shards == shard_id)
    vectors, ids, start = [], [], time.perf_counter()
    while chunk := list(itertools.islice(mine, chunk_size)):
        vectors.append(encode_passages(model, tokenizer, chunk, batch_size=batch_size, precision=runtime["precision"], progress=progress))
        ids.extend(p.id for p in chunk)
    if not ids:
        raise ValueError(f"{passages_tsv}: shard {shard_id} of {num_shards} has no passages")
    elapsed = time.perf_counter() - start
    path = shard_path(out_dir, shard_id, num_shards)
    save_shard(path, np.concatenate(vectors), ids)
    log.info("wrote %d passage vectors to %s (%.1f passages/s)", len(ids), path, len(ids) / elapsed)
    return {"passages": len(ids), "seconds": elapsed, "passages_per_s": len(ids) / elapsed, "path": str(path), **runtime}
