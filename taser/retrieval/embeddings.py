"""Passage vectors on disk: one `.npz` per shard holding `vectors` (float32) and `ids`."""

from __future__ import annotations

import glob
import os
from pathlib import Path

import numpy as np

from taser.io import atomic_path


def shard_path(out_dir: str | os.PathLike, shard_id: int, num_shards: int) -> Path:
    return Path(out_dir) / f"embeddings_{shard_id:03d}_of_{num_shards:03d}.npz"


def save_shard(path: str | os.PathLike, vectors: np.ndarray, ids: list[str]) -> None:
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            np.savez(f, vectors=vectors.astype(np.float32), ids=np.asarray(ids, dtype=str))


def load_shards(pattern_or_dir: str | os.PathLike) -> tuple[np.ndarray, list[str]]:
    """Concatenate shards (a directory of `embeddings_*.npz`, or a glob pattern)."""
    p = str(pattern_or_dir)
    files = sorted(glob.glob(os.path.join(p, "embeddings_*.npz")) if os.path.isdir(p) else glob.glob(p))
    if not files:
        raise FileNotFoundError(f"no passage embeddings found at {p}")
    vectors, ids = [], []
    for f in files:
        with np.load(f) as data:
            vectors.append(data["vectors"])
            ids.extend(str(x) for x in data["ids"])
    totals = {name.rsplit("_of_", 1)[-1] for name in files}
    if len(totals) == 1 and "_of_" in files[0]:
        expected = int(totals.pop().split(".")[0])
        if len(files) != expected:
            raise FileNotFoundError(f"{p}: found {len(files)} of {expected} embedding shards")
    return np.concatenate(vectors), ids
