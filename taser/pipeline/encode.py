"""Stage: encode a passages TSV with the passage side of a checkpoint, one contiguous shard per
call (or per `torchrun` rank), in chunks that a re-run after a kill continues from."""

from __future__ import annotations

import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from taser.data.passage_store import PassageStore
from taser.models.backends import backend_record, resolve_backend, vectors_precision
from taser.models.encoding import device_of, encode_ids, encoding_runtime
from taser.models.inputs import passage_ids
from taser.models.loading import load_checkpoint
from taser.progress import progress as progress_bar
from taser.retrieval.embeddings import ShardWriter, checkpoint_identity, passages_identity, shard_range
from taser.runtime import describe_hardware, pick_device

log = logging.getLogger(__name__)


def launcher_shard() -> tuple[int, int]:
    """(shard_id, num_shards) from torchrun's RANK and WORLD_SIZE (one shard per process, across
    machines too), else from SLURM's tasks of a step (`srun -n 8 scripts/encode_passages.py`: task
    SLURM_PROCID of SLURM_STEP_NUM_TASKS, its GPU the one of SLURM_LOCALID); (0, 1) otherwise."""
    from taser.training.distributed import slurm_environment

    os.environ.update(slurm_environment())  # srun's tasks as torchrun's ranks: RANK, WORLD_SIZE, LOCAL_RANK (the task's GPU)
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def encode_corpus(
    checkpoint: str | os.PathLike,
    passages_tsv: str | os.PathLike,
    out_dir: str | os.PathLike,
    shard_id: int | None = None,
    num_shards: int | None = None,
    batch_size: int | None = None,
    precision: str = "auto",
    chunk_size: int = 10_000,
    device: str = "auto",
    progress: bool = True,
    dtype: str = "float32",
    offsets_cache: str | os.PathLike | None = None,
    backend: str = "torch",
) -> dict:
    """Encode shard `shard_id` of `num_shards` (default: this torchrun rank of the world) into
    `out_dir/shard_<k>_of_<n>/`; see `taser.retrieval.embeddings` for the layout and checks.
    `backend` (`taser.models.backends`) runs the encoder; the backend it resolves to (and its recipe)
    is in the manifest, so a resumed shard never mixes vectors of two backends or recipes.

    Only the shard's own rows of the TSV are read (after one scan that indexes the file;
    `offsets_cache` keeps that index for the next shard). `dtype="float16"` halves the disk.
    """
    if (shard_id is None) != (num_shards is None):
        raise ValueError("give both shard_id and num_shards, or neither (torchrun's rank and world size)")
    if shard_id is None:
        shard_id, num_shards = launcher_shard()
    start_time = time.perf_counter()
    backend = resolve_backend(backend, pick_device(device).type)  # `auto` is recorded as what it ran
    with PassageStore(passages_tsv, cache=offsets_cache) as store:
        start, end = shard_range(len(store), shard_id, num_shards)
        if start == end:
            raise ValueError(f"{passages_tsv}: shard {shard_id} of {num_shards} has no passages ({len(store)} in all)")
        manifest = {"checkpoint": checkpoint_identity(checkpoint), "passages": passages_identity(passages_tsv, len(store)),
                    "num_shards": num_shards, "shard_id": shard_id, "start": start, "end": end, "chunk_size": chunk_size, "dtype": dtype,
                    **backend_record(backend), "precision": vectors_precision(backend, precision, pick_device(device))}  # a resume must match them
        writer = ShardWriter(out_dir, manifest)
        done = writer.done()
        if done:
            log.info("%s: %d of %d chunks already encoded; continuing", writer.dir, done, writer.num_chunks)
        runtime = None
        encoded = 0
        first_row = writer.chunk_rows(done)[0] if done < writer.num_chunks else end
        bar = progress_bar(total=end - start, initial=first_row - start, desc=f"encode passages (shard {shard_id} of {num_shards})",
                           unit="passage", enabled=progress and done < writer.num_chunks)
        try:
            if done < writer.num_chunks:
                model, tokenizer = load_checkpoint(checkpoint, device, backend)
                runtime = encoding_runtime(model, precision)
                log.info("encoding rows %d-%d in %s (precision=%s, backend %s) on %s", start, end, runtime["precision"], precision,
                         runtime["backend"], describe_hardware(device_of(model)))
                encoded, dim = _encode_chunks(store, writer, done, model, tokenizer, batch_size, runtime["precision"], bar)
        finally:
            bar.close()
        if done < writer.num_chunks or not writer.manifest.get("dim"):
            writer.finish(dim if encoded else _dim_of_chunk(writer))
    elapsed = time.perf_counter() - start_time
    log.info("shard %d of %d: %d passages encoded now, %d in all, at %s (%.1f passages/s)", shard_id, num_shards, encoded, end - start,
             writer.dir, encoded / max(elapsed, 1e-9))
    return {"passages": end - start, "encoded_now": encoded, "seconds": elapsed, "passages_per_s": encoded / max(elapsed, 1e-9),
            "path": str(writer.dir), **(runtime or {})}


def _encode_chunks(store: PassageStore, writer: ShardWriter, first: int, model, tokenizer, batch_size, precision: str, bar) -> tuple[int, int]:
    """Encode chunks `first`.. of the shard in order: while the device encodes chunk i, one
    thread reads and tokenises chunk i+1 and another writes chunk i-1 (the tokenizer and the
    file writes release the GIL), so the device does not wait on either. Every chunk is written
    whole or not at all, in order; the (passages encoded, dimension)."""

    def prepare(i: int):
        passages = store.read_rows(*writer.chunk_rows(i))
        return passages, passage_ids(tokenizer, [p.title for p in passages], [p.text for p in passages], model.config.max_length)

    encoded, dim, writes = 0, 0, []
    with ThreadPoolExecutor(1, thread_name_prefix="read") as reader, ThreadPoolExecutor(1, thread_name_prefix="write") as saver:
        upcoming = reader.submit(prepare, first)
        for i in range(first, writer.num_chunks):
            passages, ids = upcoming.result()
            if i + 1 < writer.num_chunks:
                upcoming = reader.submit(prepare, i + 1)
            vectors = encode_ids(model, tokenizer, ids, "passage", batch_size=batch_size, precision=precision, bar=bar)
            writes.append(saver.submit(writer.write_chunk, i, vectors, [p.id for p in passages]))
            while writes and writes[0].done():
                writes.pop(0).result()  # a failed write stops the run now
            encoded += len(passages)
            dim = vectors.shape[1]
        for w in writes:
            w.result()
    return encoded, dim


def _dim_of_chunk(writer: ShardWriter) -> int:
    with np.load(writer.chunk_path(0)) as data:
        return int(data["vectors"].shape[1])
