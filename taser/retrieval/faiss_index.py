"""FAISS indexes over passage vectors, built chunk by chunk and saved with compact ids.

An index directory holds `index.faiss`, `ids.npy` (int64 when every id is a canonical decimal
number, as DPR's are, else fixed-width bytes: no Python object per passage) and `index.json`
(the settings, the resolved type, size, width, and the checkpoint and passages file the vectors
came from). Types and their settings: `taser.retrieval.index_types`.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, replace
from pathlib import Path

import faiss
import numpy as np

from taser.io import atomic_dir
from taser.retrieval.index_memory import ivf_of, list_assignments, release_freed_memory, reserve
from taser.retrieval.index_types import IndexConfig, IndexType, SearchSettings, choose, estimates

log = logging.getLogger(__name__)

# Rows given to an inverted-file index per add: its per-add work buffers (residuals, codes,
# assignments) scale with the rows of one add, so a large chunk would lift the build's peak by a
# chunk's worth of them. Inverted lists only: HNSW inserts each add's vectors in level order, so
# splitting its adds would change the graph it builds.
ADD_BLOCK = 4096
Chunks = Callable[[], Iterator[tuple[np.ndarray, np.ndarray]]]  # a fresh pass over (vectors, ids) each call


def _canonical_numbers(raw: np.ndarray) -> np.ndarray | None:
    """The ids as int64 when every one is a canonical decimal number ("7", not "007" or "+7"), else None."""
    try:
        numbers = raw.astype(np.int64)
    except (ValueError, OverflowError):
        return None
    return numbers if len(raw) and (numbers >= 0).all() and np.array_equal(numbers.astype(bytes), raw) else None


class _IdColumn:
    """A part's passage ids, compacted chunk by chunk into one preallocated array (int64 while every
    id is a canonical decimal number, as DPR's are; fixed-width bytes from the first that is not), so
    that the ids never exist as Python strings or twice at once while an index is built."""

    def __init__(self, size: int):
        self.numbers: np.ndarray | None = np.empty(size, dtype=np.int64)
        self.raw: list[np.ndarray] = []
        self.filled = 0

    def add(self, ids) -> None:
        raw = np.asarray(ids).astype(bytes)
        if self.numbers is not None:
            numbers = _canonical_numbers(raw)
            if numbers is not None:
                self.numbers[self.filled : self.filled + len(raw)] = numbers
                self.filled += len(raw)
                return
            self.raw, self.numbers = [self.numbers[: self.filled].astype(bytes)], None
        self.raw.append(raw)
        self.filled += len(raw)

    def array(self) -> np.ndarray:
        if self.numbers is not None:
            return self.numbers[: self.filled]
        return np.concatenate(self.raw) if self.raw else np.array([], dtype=bytes)


def _training_sample(chunks: Chunks, count: int, dim: int, size: int, seed: int = 0) -> np.ndarray:
    """`size` vectors drawn uniformly from all of them, in one pass over the chunks, written into
    one preallocated array (gathering pieces and concatenating would hold the sample twice)."""
    wanted = np.sort(np.random.default_rng(seed).choice(count, size=min(size, count), replace=False))
    sample, start = np.empty((len(wanted), dim), dtype=np.float32), 0
    for vectors, _ in chunks():
        end = start + len(vectors)
        lo, hi = np.searchsorted(wanted, [start, end])
        sample[lo:hi] = vectors[wanted[lo:hi] - start]
        start = end
    if start != count:  # rows past the end would be left unwritten
        raise ValueError(f"expected {count} vectors, the chunks held {start}")
    return sample


def _list_sizes(index: faiss.Index, chunks: Chunks, bounds: list[int], wanted) -> dict[int, np.ndarray]:
    """Per part, how many vectors each inverted list of `index` will hold (one pass over the vectors)."""
    nlist = ivf_of(index).nlist
    sizes = {s: np.zeros(nlist, dtype=np.int64) for s in wanted}
    start = 0
    for vectors, _ in chunks():
        assigned = list_assignments(index, vectors)
        for s in wanted:
            lo, hi = max(bounds[s], start) - start, min(bounds[s + 1], start + len(vectors)) - start
            if hi > lo:
                sizes[s] += np.bincount(assigned[lo:hi], minlength=nlist)
        start += len(vectors)
    return sizes


def _skip_polysemous_training(index: faiss.Index) -> None:
    """FAISS's factory turns on polysemous training for IVF-PQ: a search for a code permutation
    that only Hamming-filtered search uses (never done here), and ~80% of the training time
    (132 s of 155 s for 20,000 x 384 vectors, PQ64, on 2 cores)."""
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None:
        ivf = faiss.downcast_index(ivf)
        if isinstance(ivf, faiss.IndexIVFPQ):
            ivf.do_polysemous_training = False


class PassageIndex:
    """A FAISS index over passage vectors with their passage ids: `build` (in memory) or `build_streamed`
    (from chunks on disk), `search` (scores and ids, best first), `save` and `load` a directory."""

    def __init__(self, index: faiss.Index, ids: np.ndarray, config: IndexConfig, meta: dict | None = None):
        if index.ntotal != len(ids):
            raise ValueError(f"index holds {index.ntotal} vectors but {len(ids)} ids")
        self.index, self._ids, self.config, self.meta = index, ids, config, meta or {}

    @property
    def ids(self) -> list[str]:
        return [self.id_at(r) for r in range(len(self._ids))]

    def id_at(self, row: int) -> str:
        value = self._ids[row]
        return str(int(value)) if self._ids.dtype == np.int64 else bytes(value).decode("utf-8")

    @classmethod
    def build(cls, vectors: np.ndarray, ids: Iterable[str], config: IndexConfig, meta: dict | None = None) -> PassageIndex:
        """An index over vectors held in memory (small corpora, tests)."""
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        ids = np.asarray(list(ids), dtype=str)
        if vectors.ndim != 2 or len(vectors) != len(ids):
            raise ValueError(f"expected {len(ids)} vectors in a 2-D array, got shape {vectors.shape}")
        return cls.build_streamed(lambda: iter([(vectors, ids)]), len(ids), vectors.shape[1], config, meta)

    @classmethod
    def build_streamed(cls, chunks: Chunks, count: int, dim: int, config: IndexConfig, meta: dict | None = None):
        """Add the vectors chunk by chunk (never all at once); a type that needs training is first
        trained on `train_size` vectors sampled from all of them (one extra pass). With
        `num_shards` > 1: a `ShardedIndex` of that many parts over contiguous rows, sharing the
        trained layout."""
        sizes = estimates(config, dim, count)
        log.info("estimated index sizes for %d vectors of width %d: %s", count, dim, ", ".join(f"{t} {gb:.2f} GB" for t, gb in sizes.items()))
        config = replace(config, type=choose(config, dim, count))
        meta = meta or {}
        log.info("building a %s index (%s) in %d part(s)", config.type, config.factory(dim, count), config.num_shards)
        metric = faiss.METRIC_INNER_PRODUCT if config.metric == "ip" else faiss.METRIC_L2
        template = faiss.index_factory(dim, config.factory(dim, count), metric)
        if isinstance(template, faiss.IndexHNSW):
            template.hnsw.efConstruction = config.ef_construction
        _skip_polysemous_training(template)
        if config.needs_training:
            template.train(_training_sample(chunks, count, dim, config.train_size))
            release_freed_memory()
        parts = config.num_shards
        bounds = [count * s // parts for s in range(parts + 1)]
        wanted = range(parts) if config.part is None else [config.part]
        indexes = {s: template if i == 0 else faiss.clone_index(template) for i, s in enumerate(wanted)}
        list_sizes = _list_sizes(template, chunks, bounds, wanted) if ivf_of(template) is not None else {}
        release_freed_memory()
        for s in wanted:  # each part's final capacity at once: adding never doubles a buffer (peak ~ final size)
            reserve(indexes[s], bounds[s + 1] - bounds[s], list_sizes.get(s))
        id_columns = {s: _IdColumn(bounds[s + 1] - bounds[s]) for s in wanted}
        start, inverted = 0, ivf_of(template) is not None
        for vectors, ids in chunks():
            for s in wanted:  # the rows of this chunk that fall in part s
                lo, hi = max(bounds[s], start) - start, min(bounds[s + 1], start + len(vectors)) - start
                step = ADD_BLOCK if inverted else max(hi - lo, 1)
                for block in range(lo, hi, step):
                    end = min(block + step, hi)
                    indexes[s].add(np.ascontiguousarray(vectors[block:end], dtype=np.float32))
                    id_columns[s].add(np.asarray(ids)[block:end])
            start += len(vectors)
        if start != count:
            raise ValueError(f"expected {count} vectors, the chunks held {start}")
        built = [cls(indexes[s], id_columns[s].array(), config, {**meta, "rows": [bounds[s], bounds[s + 1]]} if parts > 1 else meta)
                 for s in wanted]
        return built[0] if parts == 1 or config.part is not None else ShardedIndex(built, config, meta)

    def use_search(self, search: SearchSettings) -> None:
        """Search with `search`'s settings from now on (no rebuild: they are read at each search)."""
        self.config = search.apply(self.config)

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, list[list[str]]]:
        """Scores [n, k'] (higher is better) and passage ids, k' = min(k, size). Where fewer than k'
        passages are found (an `ivf_pq` query whose probed lists hold fewer), the row of ids is
        shorter and the scores past its end are -inf."""
        k = min(k, self.index.ntotal)
        if isinstance(self.index, faiss.IndexHNSW):
            self.index.hnsw.efSearch = max(self.config.ef_search, k)
        if self.config.type == IndexType.ivf_pq:
            faiss.extract_index_ivf(self.index).nprobe = self.config.nprobe
        distances, rows = self.index.search(np.ascontiguousarray(queries, dtype=np.float32), k)
        scores = -distances if self.config.metric == "l2" else distances
        scores[rows < 0] = -np.inf  # FAISS puts the missing results (row -1) last, with its worst distance
        return scores, [[self.id_at(r) for r in row if r >= 0] for row in rows]

    def save(self, directory: str | os.PathLike) -> None:
        with atomic_dir(directory) as tmp:
            faiss.write_index(self.index, str(tmp / "index.faiss"))
            np.save(tmp / "ids.npy", self._ids)
            info = {**asdict(self.config), "size": int(self.index.ntotal), "dim": int(self.index.d), **self.meta}
            (tmp / "index.json").write_text(json.dumps(info, indent=2))

    @classmethod
    def load(cls, directory: str | os.PathLike) -> PassageIndex:
        directory = Path(directory)
        meta_file = directory / "index.json"
        if not meta_file.is_file():
            raise FileNotFoundError(f"not an index directory (no index.json): {directory}")
        info = json.loads(meta_file.read_text())
        settings = {k: info.pop(k) for k in list(info) if k in IndexConfig.__dataclass_fields__}
        for derived in ("size", "dim"):
            info.pop(derived, None)
        index = faiss.read_index(str(directory / "index.faiss"))
        return cls(index, np.load(directory / "ids.npy"), IndexConfig(**settings), info)


class ShardedIndex:
    """Several `PassageIndex` parts over contiguous rows, searched together: each part's top-k,
    merged by score. For `flat` the result is that of one index over all rows."""

    def __init__(self, parts: list[PassageIndex], config: IndexConfig, meta: dict | None = None):
        self.parts, self.config, self.meta = parts, config, meta or {}

    @property
    def ids(self) -> list[str]:
        return [pid for part in self.parts for pid in part.ids]

    @property
    def size(self) -> int:
        return sum(part.index.ntotal for part in self.parts)

    def use_search(self, search: SearchSettings) -> None:
        for part in self.parts:
            part.use_search(search)
        self.config = search.apply(self.config)

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, list[list[str]]]:
        results = [part.search(queries, k) for part in self.parts]
        k = min(k, self.size)
        scores = np.concatenate([r[0] for r in results], axis=1)
        # a part that found fewer than k has a shorter row of ids than of scores: padded, so that ids stay beside their scores
        ids = [[pid for r in results for pid in r[1][q] + [None] * (r[0].shape[1] - len(r[1][q]))] for q in range(len(queries))]
        order = np.argsort(-scores, axis=1, kind="stable")[:, :k]  # ties keep the parts' row order; missing ones (-inf) last
        return (np.take_along_axis(scores, order, axis=1),
                [[row_ids[j] for j in row if row_ids[j] is not None] for row_ids, row in zip(ids, order)])

    def save(self, directory: str | os.PathLike) -> None:
        with atomic_dir(directory) as tmp:
            for s, part in enumerate(self.parts):
                part.save(part_dir(tmp, s))
            info = {**asdict(self.config), "size": self.size, "dim": int(self.parts[0].index.d), **self.meta}
            (tmp / "index.json").write_text(json.dumps(info, indent=2))


def part_dir(directory: str | os.PathLike, part: int) -> Path:
    return Path(directory) / f"part_{part:03d}"


_SEARCH_SETTING_TYPES = {"ef_search": (IndexType.hnsw, IndexType.hnsw_sq8), "nprobe": (IndexType.ivf_pq,)}


def load_index(directory: str | os.PathLike, search: SearchSettings | None = None) -> PassageIndex | ShardedIndex:
    """An index directory as saved by `PassageIndex.save` or `ShardedIndex.save`, or holding the
    `part_<s>/` indexes built one per process (`index.part`), checked to be all there and contiguous.
    `search`: search settings in place of those it was built with (`SearchSettings`)."""
    index = _load_index(Path(directory))
    if search is not None and search.given():
        unused = [name for name in search.given() if index.config.type not in _SEARCH_SETTING_TYPES[name]]
        if unused:
            log.warning("search.%s has no effect on the %s index %s", " and search.".join(unused), index.config.type, directory)
        index.use_search(search)
    return index


def _load_index(directory: Path) -> PassageIndex | ShardedIndex:
    meta_file = directory / "index.json"
    found = sorted(directory.glob("part_*/index.json"))
    if not meta_file.is_file() and not found:
        raise FileNotFoundError(f"not an index directory (no index.json, no part_<s>/): {directory}")
    info = json.loads((meta_file if meta_file.is_file() else found[0]).read_text())
    parts = int(info.get("num_shards", 1))
    if parts == 1:
        return PassageIndex.load(directory)
    missing = [s for s in range(parts) if not (part_dir(directory, s) / "index.json").is_file()]
    if missing:
        raise ValueError(f"{directory}: index part(s) {missing} of {parts} are missing (build them with index.part=<s>)")
    loaded = [PassageIndex.load(part_dir(directory, s)) for s in range(parts)]
    position = 0
    for s, part in enumerate(loaded):
        rows = part.meta.get("rows")
        if part.config.num_shards != parts or (rows is not None and rows[0] != position):
            raise ValueError(f"{part_dir(directory, s)} does not continue the parts before it (rows {rows}, expected from {position} "
                             f"of {parts} parts): build every part from the same embeddings with the same index.num_shards")
        position = rows[1] if rows is not None else position
    return ShardedIndex(loaded, loaded[0].config, {k: v for k, v in loaded[0].meta.items() if k != "rows"})


def metric_for(similarity: str) -> str:
    return "l2" if similarity == "l2" else "ip"
