"""Random access by id to the passages of a DPR passages TSV, without loading the corpus.

One pass over the TSV (through the `csv` module, so quoted fields are read exactly as
`read_passages` reads them) records each row's byte offset and length; passages are read back
from disk on demand with `os.pread` (thread-safe, fork-safe). The id -> row map lives in
sorted numpy arrays: canonical decimal ids (DPR's "1" .. "21015324") as int64, any others as
fixed-width bytes, looked up by binary search. For DPR's 21M-passage Wikipedia that is about
0.4 GB (id, offset, length per passage), against tens of GB for a dict of Python strings.

The scan takes minutes on a 21M-passage file, so the arrays are kept in a `.npz` file, reused while
the TSV's `file_stamp` (path, size, inode, modification and status-change times) is unchanged: at
`cache=` when given, else, for a file of OFFSETS_MIN_BYTES or more, in one cache per passages file
under `taser.io.cache_home()` (`passage-offsets/`), which every process of the machine (of the
cluster, with a shared home) reads: the ranks of an encoding, and every evaluation, mining and
reader stage after it, scan the file once between them. The first to need it builds it while the
others wait on its lock (`flock`; where the file system has none, each builds its own).
"""

from __future__ import annotations

import contextlib
import csv
import io
import logging
import os
import time
import zipfile
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from taser.data.errors import DataFormatError
from taser.data.passages import Passage, check_header, row_to_passage
from taser.io import atomic_path, cache_home, file_stamp
from taser.progress import progress

PROGRESS_ROWS = 10_000  # rows between progress updates of the scan
OFFSETS_MIN_BYTES = 64 << 20  # smaller files are scanned in seconds: no shared cache

log = logging.getLogger(__name__)

CACHE_FORMAT = 2
_CHUNK = 1 << 20  # ids gathered in Python lists at most this many at a time


def default_cache(path: Path) -> Path | None:
    """The shared offsets cache of passages file `path` (None below OFFSETS_MIN_BYTES)."""
    import hashlib
    import json

    stamp = file_stamp(path)
    if stamp[1] < OFFSETS_MIN_BYTES:
        return None
    return cache_home() / "passage-offsets" / f"{path.name}.{hashlib.sha1(json.dumps(stamp).encode()).hexdigest()[:16]}.npz"


@contextlib.contextmanager
def _exclusive(cache: Path):
    """An exclusive lock beside `cache` while it is built (best effort: none where flock is refused)."""
    import fcntl

    cache.parent.mkdir(parents=True, exist_ok=True)
    with open(cache.with_name(cache.name + ".lock"), "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX)
        except OSError as error:
            log.debug("no lock on %s (%s): building without it", cache, error)
        yield


def _stamp(path: Path) -> np.ndarray:
    return np.array([*map(str, file_stamp(path)), str(CACHE_FORMAT)])


def _scan(path: Path) -> Iterator[tuple[int, int, Passage]]:
    """(byte offset, byte length, passage) of each data row of a passages TSV."""
    with open(path, "rb") as f:
        pos = 0

        def lines() -> Iterator[str]:
            nonlocal pos
            for raw in f:  # csv.reader pulls lines only until the current row is complete
                pos += len(raw)
                yield raw.decode("utf-8")

        reader = csv.reader(lines(), delimiter="\t")
        check_header(next(reader, None), path)
        start = pos
        for row in reader:
            if row:
                yield start, pos - start, row_to_passage(row, path, reader.line_num)
            start = pos


def _int_keys(keys: np.ndarray) -> np.ndarray | None:
    """`keys` (bytes) as int64 when every one is a canonical non-negative decimal integer, else None."""
    if not len(keys) or keys.dtype.itemsize > 18:
        return None
    try:
        ints = keys.astype(np.int64)
    except ValueError:
        return None
    canonical = ints.min() >= 0 and np.array_equal(ints.astype(keys.dtype), keys)
    return ints if canonical else None


class PassageStore:
    """`store[pid]` -> Passage, `store.get_many(pids)` -> {pid: Passage}, for a passages TSV."""

    def __init__(self, passages_tsv: str | os.PathLike, cache: str | os.PathLike | None = None):
        self.path = Path(passages_tsv)
        if not self.path.is_file():
            raise FileNotFoundError(f"passages file not found: {self.path}")
        cache = Path(cache) if cache else default_cache(self.path)
        if cache is None:
            self._build()
        elif not self._load_cache(cache):
            try:
                locked = _exclusive(cache)
                locked.__enter__()
            except OSError as error:  # an unwritable cache directory: only slower
                log.warning("passage offsets not cached at %s (%s)", cache, error)
                locked = None
            try:
                if locked is None or not self._load_cache(cache):  # another process may have built it while this one waited
                    self._build()
                    if locked is not None:
                        self._save_cache(cache)
            finally:
                if locked is not None:
                    locked.__exit__(None, None, None)
        self._fd = os.open(self.path, os.O_RDONLY)
        self._file_order: tuple[np.ndarray, np.ndarray] | None = None  # offsets and lengths in file order

    # -- building ---------------------------------------------------------------------------

    def _build(self) -> None:
        start = time.perf_counter()
        key_parts, offset_parts, length_parts = [], [], []
        keys: list[bytes] = []
        offsets: list[int] = []
        lengths: list[int] = []

        def flush() -> None:
            key_parts.append(np.array(keys, dtype=bytes))
            offset_parts.append(np.array(offsets, dtype=np.int64))
            length_parts.append(np.array(lengths, dtype=np.int64))
            keys.clear()
            offsets.clear()
            lengths.clear()

        size = self.path.stat().st_size
        with progress(total=size, desc=f"index the passages of {self.path.name}", unit="B", unit_scale=True) as bar:
            for n, (offset, length, p) in enumerate(_scan(self.path), 1):
                keys.append(p.id.encode("utf-8"))
                offsets.append(offset)
                lengths.append(length)
                if len(keys) >= _CHUNK:
                    flush()
                if n % PROGRESS_ROWS == 0:
                    bar.update(offset + length - bar.n)
            bar.update(size - bar.n)
        flush()
        width = max(a.dtype.itemsize for a in key_parts)
        raw = np.concatenate([a.astype(f"S{width}") for a in key_parts])
        if not len(raw):
            raise DataFormatError(self.path, "line 2", "no passages after the header")
        ints = _int_keys(raw)
        key_array = raw if ints is None else ints
        order = np.argsort(key_array, kind="stable")
        self._keys = key_array[order]
        self._offsets = np.concatenate(offset_parts)[order]
        lengths_all = np.concatenate(length_parts)[order]
        if lengths_all.max() >= 1 << 32:
            raise DataFormatError(self.path, "a row", "a passage row is longer than 4 GB")
        self._lengths = lengths_all.astype(np.uint32)
        dup = np.flatnonzero(self._keys[1:] == self._keys[:-1])
        if len(dup):
            pid = self._key_str(self._keys[dup[0]])
            raise DataFormatError(self.path, f"passage id {pid!r}", f"appears more than once ({len(dup)} duplicate ids)")
        seconds = time.perf_counter() - start
        log.info("indexed %d passages of %s in %.1f s (%s ids)", len(self), self.path, seconds, "integer" if ints is not None else "string")

    def _load_cache(self, cache: Path) -> bool:
        if not cache.is_file():
            return False
        try:
            with np.load(cache, allow_pickle=False) as data:
                if not np.array_equal(data["stamp"], _stamp(self.path)):
                    log.info("%s is for another version of %s; rebuilding it", cache, self.path)
                    return False
                self._keys, self._offsets, self._lengths = data["keys"], data["offsets"], data["lengths"]
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as error:
            log.warning("%s does not load (%s): rebuilding it", cache, error)
            return False
        return True

    def _save_cache(self, cache: Path) -> None:
        with atomic_path(cache) as tmp:
            with open(tmp, "wb") as f:
                np.savez(f, keys=self._keys, offsets=self._offsets, lengths=self._lengths, stamp=_stamp(self.path))

    # -- lookups ----------------------------------------------------------------------------

    @property
    def integer_ids(self) -> bool:
        return self._keys.dtype == np.int64

    def _key_str(self, key) -> str:
        return str(int(key)) if self.integer_ids else bytes(key).decode("utf-8")

    def _key(self, pid: str):
        if self.integer_ids:
            # only the canonical spelling matches: "7" is a passage id, "007" is not
            return int(pid) if pid.isascii() and pid.isdigit() and str(int(pid)) == pid else None
        return pid.encode("utf-8")

    def _row(self, pid: str) -> int | None:
        key = self._key(pid)
        if key is None or (not self.integer_ids and len(key) > self._keys.dtype.itemsize):
            return None
        i = int(np.searchsorted(self._keys, key))
        return i if i < len(self._keys) and self._keys[i] == key else None

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, pid: str) -> bool:
        return self._row(pid) is not None

    def _read(self, row: int) -> Passage:
        data = os.pread(self._fd, int(self._lengths[row]), int(self._offsets[row]))
        fields = next(csv.reader(io.StringIO(data.decode("utf-8"), newline=""), delimiter="\t"))
        return Passage(fields[0].strip(), fields[1], fields[2] if len(fields) > 2 else "")

    def __getitem__(self, pid: str) -> Passage:
        row = self._row(pid)
        if row is None:
            raise KeyError(f"passage id {pid!r} is not in {self.path}")
        return self._read(row)

    def get_many(self, pids: Iterable[str]) -> dict[str, Passage]:
        """The passages of `pids` (read in file order); KeyError naming the missing ids."""
        wanted = list(dict.fromkeys(pids))
        rows = [self._row(pid) for pid in wanted]
        missing = [pid for pid, row in zip(wanted, rows) if row is None]
        if missing:
            raise KeyError(f"{len(missing)} passage ids are not in {self.path}, e.g. {missing[:3]}")
        found = sorted(zip(rows, wanted), key=lambda rw: int(self._offsets[rw[0]]))
        return {pid: self._read(row) for row, pid in found}

    def read_rows(self, start: int, end: int) -> list[Passage]:
        """The passages of file rows [start, end) (0 = the first after the header), read in one
        sequential pass from the first one's byte offset: a shard of a large corpus reads only
        its own part of the file."""
        if not 0 <= start <= end <= len(self):
            raise IndexError(f"rows [{start}, {end}) outside the {len(self)} passages of {self.path}")
        if start == end:
            return []
        if self._file_order is None:
            order = np.argsort(self._offsets, kind="stable")  # rows appear in the file by increasing offset
            self._file_order = (self._offsets[order], self._lengths[order])
        offsets, lengths = self._file_order
        first, stop = int(offsets[start]), int(offsets[end - 1]) + int(lengths[end - 1])
        data = os.pread(self._fd, stop - first, first)
        reader = csv.reader(io.StringIO(data.decode("utf-8"), newline=""), delimiter="\t")
        out = []
        for row in reader:
            if row:  # a blank line between rows, as the scan skips it
                out.append(row_to_passage(row, self.path, start + len(out) + 2))
        if len(out) != end - start:
            raise DataFormatError(self.path, f"rows {start}-{end}", f"read {len(out)} passages where {end - start} were indexed")
        return out

    def ids(self) -> Iterator[str]:
        """Every passage id, in sorted key order."""
        for key in self._keys:
            yield self._key_str(key)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> PassageStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_fd"] = None
        return state

    def __setstate__(self, state) -> None:
        self.__dict__.update(state)
        self._fd = os.open(self.path, os.O_RDONLY)
