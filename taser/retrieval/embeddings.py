"""Passage vectors on disk, in shards that resume and that check each other.

An embeddings directory holds one folder per shard, `shard_<k>_of_<n>/`, each with:
- `manifest.json`: the checkpoint, the passages file's identity (name, size, rows, a hash of
  its head and tail), the number of shards, this shard's rows [start, end) of the file, the
  chunk size, the vector dtype and width, and whether the shard is complete;
- `chunk_<i>.npz`: the vectors (`float32` or `float16`) and ids of the shard's i-th chunk of
  rows, each written whole (temporary file, then rename).

A shard covers a contiguous range of the passages file. Encoding again with the same settings
continues after the last complete chunk; chunks are fixed ranges of rows, so the result equals
an uninterrupted run. `read_embeddings` refuses missing, incomplete, duplicate or mismatched
shards, and shards that together do not hold every passage exactly once.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from taser.io import atomic_open, atomic_path
from taser.models.backends import RECORD_KEYS

log = logging.getLogger(__name__)

FORMAT = "taser-embeddings-1"
DTYPES = ("float32", "float16")
_SHARD_DIR = re.compile(r"shard_(\d+)_of_(\d+)$")
_FIXED = ("format", "checkpoint", "passages", "num_shards", "shard_id", "start", "end", "chunk_size", "dtype",
          *RECORD_KEYS)  # must match to resume


def shard_range(rows: int, shard_id: int, num_shards: int) -> tuple[int, int]:
    """Rows [start, end) of shard `shard_id`: contiguous, sizes differing by at most one."""
    if not 0 <= shard_id < num_shards:
        raise ValueError(f"shard_id must be in 0..{num_shards - 1}, got {shard_id}")
    return rows * shard_id // num_shards, rows * (shard_id + 1) // num_shards


def _head_tail_sha1(path: Path, size: int) -> str:
    digest = hashlib.sha1()
    with open(path, "rb") as f:
        digest.update(f.read(1 << 20))
        f.seek(max(0, size - (1 << 20)))
        digest.update(f.read(1 << 20))
    return digest.hexdigest()


def passages_identity(path: str | os.PathLike, rows: int) -> dict:
    """What tells one passages file from another, without reading it all: name, size, rows and
    a hash of its first and last MiB (a copy on another machine has the same identity)."""
    path = Path(path)
    size = path.stat().st_size
    return {"name": path.name, "size": size, "rows": rows, "head_tail_sha1": _head_tail_sha1(path, size)}


def check_same_passages(identity: dict | None, passages_tsv: str | os.PathLike, what: str) -> None:
    """Refuse `passages_tsv` when `what` (an index, embeddings) was made from another passages
    file; compared without reading the whole file (name, size, head and tail). None: not recorded."""
    if identity is None:
        return
    path = Path(passages_tsv)
    size = path.stat().st_size
    actual = {"name": path.name, "size": size, "head_tail_sha1": _head_tail_sha1(path, size)}
    recorded = {k: identity.get(k) for k in actual}
    if recorded != actual:
        raise ValueError(f"{what} was built from another passages file than {passages_tsv}: {recorded} vs {actual}")


def checkpoint_identity(checkpoint: str | os.PathLike) -> dict:
    """The checkpoint's name and a hash of its weights file's size, head and tail: a retrained
    checkpoint at the same path is another checkpoint."""
    weights = Path(checkpoint) / "model.safetensors"
    if not weights.is_file():
        raise FileNotFoundError(f"checkpoint {checkpoint} has no model.safetensors")
    size = weights.stat().st_size
    return {"name": Path(checkpoint).resolve().name, "weights_size": size, "weights_head_tail_sha1": _head_tail_sha1(weights, size)}


def shard_dir(out_dir: str | os.PathLike, shard_id: int, num_shards: int) -> Path:
    return Path(out_dir) / f"shard_{shard_id:03d}_of_{num_shards:03d}"


class ShardWriter:
    """Writes one shard chunk by chunk; `done` chunks found on disk are kept (resume)."""

    def __init__(self, out_dir: str | os.PathLike, manifest: dict):
        if manifest["dtype"] not in DTYPES:
            raise ValueError(f"unknown vector dtype {manifest['dtype']!r}; expected one of {', '.join(DTYPES)}")
        self.dir = shard_dir(out_dir, manifest["shard_id"], manifest["num_shards"])
        self.manifest = {"format": FORMAT, **manifest, "complete": False}
        existing = self.dir / "manifest.json"
        old = json.loads(existing.read_text()) if existing.is_file() else {}
        changed = [k for k in _FIXED if old and old.get(k) != self.manifest.get(k)]
        if changed:
            raise ValueError(f"{self.dir} was written with other settings ({', '.join(changed)} differ): "
                             "remove it, or encode with the settings it was started with")
        self.dir.mkdir(parents=True, exist_ok=True)
        self._write_manifest(complete=bool(old.get("complete")))

    @property
    def num_chunks(self) -> int:
        rows = self.manifest["end"] - self.manifest["start"]
        return -(-rows // self.manifest["chunk_size"])

    def chunk_rows(self, i: int) -> tuple[int, int]:
        start = self.manifest["start"] + i * self.manifest["chunk_size"]
        return start, min(start + self.manifest["chunk_size"], self.manifest["end"])

    def chunk_path(self, i: int) -> Path:
        return self.dir / f"chunk_{i:06d}.npz"

    def done(self) -> int:
        """How many chunks, from the first, are already on disk and whole. The last of them is read
        back: a node that crashed right after a rename can leave a chunk empty or short (data not yet
        on the disk); such chunks, from the last backwards, are not counted and are encoded again."""
        n = 0
        while n < self.num_chunks and self.chunk_path(n).is_file():
            n += 1
        while n > 0 and not self._chunk_loads(n - 1):
            log.warning("%s does not load (written just before a crash?): it is encoded again", self.chunk_path(n - 1))
            n -= 1
        return n

    def _chunk_loads(self, i: int) -> bool:
        start, end = self.chunk_rows(i)
        try:
            with np.load(self.chunk_path(i)) as data:
                vectors, ids = data["vectors"], data["ids"]
        except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile):
            return False
        return len(vectors) == end - start and len(ids) == end - start and vectors.dtype == np.dtype(self.manifest["dtype"])

    def write_chunk(self, i: int, vectors: np.ndarray, ids: list[str]) -> None:
        start, end = self.chunk_rows(i)
        if len(vectors) != end - start or len(ids) != end - start:
            raise ValueError(f"chunk {i} of {self.dir} holds rows [{start}, {end}), got {len(vectors)} vectors and {len(ids)} ids")
        with atomic_path(self.chunk_path(i)) as tmp:
            with open(tmp, "wb") as f:
                np.savez(f, vectors=vectors.astype(self.manifest["dtype"]), ids=np.asarray(ids, dtype=str))

    def finish(self, dim: int) -> None:
        self.manifest["dim"] = dim
        self._write_manifest(complete=True)

    def _write_manifest(self, complete: bool) -> None:
        self.manifest["complete"] = complete
        with atomic_open(self.dir / "manifest.json") as f:
            json.dump(self.manifest, f, indent=2)


def read_manifests(embeddings: str | os.PathLike, passages_tsv: str | os.PathLike | None = None) -> list[dict]:
    """Every shard's manifest, in order, after checking that together they are one whole:
    one number of shards, all present and complete, one checkpoint, passages file, dtype and
    width, contiguous rows covering every passage once (and, given `passages_tsv`, that file)."""
    root = Path(embeddings)
    if not root.is_dir():
        raise FileNotFoundError(f"no embeddings directory at {root}")
    dirs = sorted(p for p in root.iterdir() if p.is_dir() and _SHARD_DIR.search(p.name))
    if not dirs:
        raise FileNotFoundError(f"{root}: no shard_<k>_of_<n> folders (encode with taser-encode-passages)")
    totals = sorted({int(_SHARD_DIR.search(p.name).group(2)) for p in dirs})
    if len(totals) > 1:
        raise ValueError(f"{root} mixes encodings into {', '.join(map(str, totals))} shards: keep one")
    n = totals[0]
    present = {int(_SHARD_DIR.search(p.name).group(1)) for p in dirs}
    missing = sorted(set(range(n)) - present)
    if missing:
        raise ValueError(f"{root}: shard(s) {missing} of {n} are missing")
    manifests = []
    for k in range(n):
        path = shard_dir(root, k, n) / "manifest.json"
        if not path.is_file():
            raise ValueError(f"{path.parent}: no manifest.json (not a taser embeddings shard)")
        m = json.loads(path.read_text())
        if not m.get("complete"):
            raise ValueError(f"{path.parent} is incomplete: run its encoding again to finish it")
        manifests.append(m)
    first = manifests[0]
    for m in manifests[1:]:
        for key in ("format", "checkpoint", "passages", "num_shards", "dtype", "dim"):
            if m.get(key) != first.get(key):
                raise ValueError(f"{root}: shard {m['shard_id']} has {key}={m.get(key)!r}, shard 0 has {first.get(key)!r}")
    position = 0
    for m in manifests:
        if m["start"] != position:
            raise ValueError(f"{root}: shard {m['shard_id']} starts at row {m['start']}, expected {position} (a gap or an overlap)")
        position = m["end"]
    rows = first["passages"]["rows"]
    if position != rows:
        raise ValueError(f"{root}: the shards hold {position} passages, the passages file {rows}")
    if passages_tsv is not None:
        actual = passages_identity(passages_tsv, rows)
        if actual != first["passages"]:
            raise ValueError(f"{root} was encoded from another passages file than {passages_tsv}: {first['passages']} vs {actual}")
    return manifests


def iter_chunks(embeddings: str | os.PathLike, manifests: list[dict]) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(float32 vectors, ids) of every chunk, in passage order."""
    for m in manifests:
        folder = shard_dir(embeddings, m["shard_id"], m["num_shards"])
        rows = m["end"] - m["start"]
        for i in range(-(-rows // m["chunk_size"])):
            with np.load(folder / f"chunk_{i:06d}.npz") as data:
                yield data["vectors"].astype(np.float32), data["ids"]


def read_embeddings(embeddings: str | os.PathLike, passages_tsv: str | os.PathLike | None = None) -> tuple[np.ndarray, list[str]]:
    """All vectors (float32) and ids, checked by `read_manifests`."""
    manifests = read_manifests(embeddings, passages_tsv)
    vectors, ids = [], []
    for v, i in iter_chunks(embeddings, manifests):
        vectors.append(v)
        ids.extend(str(x) for x in i)
    return np.concatenate(vectors), ids
