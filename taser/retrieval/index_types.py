"""The FAISS index types a corpus can be searched with, their settings, and how much memory each
takes, so that `auto` can pick the most accurate one that fits a budget.

| type | what it stores | exact? | needs training |
|---|---|---|---|
| `flat` | every vector (float32) | yes | no |
| `hnsw` | every vector + a graph of `hnsw_m` neighbours per node | no | no |
| `hnsw_sq8` | every vector as 8-bit scalars + the graph | no | yes (value ranges) |
| `ivf_pq` | `pq_m` bytes per vector in `nlist` inverted lists (+ optional OPQ rotation) | no | yes |

Inner product throughout (dot and cosine similarity); `metric: l2` for models trained with it.
The default `hnsw_m` of 32 suits 21M passages; DPR's 512 neighbours is the
config group `index_preset=dpr_hnsw` (its graph alone is ~92 GB at 21M vectors).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

from taser.choice import Choice


class IndexType(Choice):
    auto = "auto"  # the most accurate type whose estimated size fits `memory_gb`
    flat = "flat"
    hnsw = "hnsw"
    hnsw_sq8 = "hnsw_sq8"
    ivf_pq = "ivf_pq"


class Metric(Choice):
    ip = "ip"  # inner product: dot and cosine similarity
    l2 = "l2"


# most accurate first: what `auto` tries in order
BY_ACCURACY = (IndexType.flat, IndexType.hnsw, IndexType.hnsw_sq8, IndexType.ivf_pq)


@dataclass
class IndexConfig:
    type: IndexType = IndexType.flat
    metric: Metric = Metric.ip
    hnsw_m: int = 32  # neighbours per node (DPR: 512)
    ef_construction: int = 200  # DPR: 200
    ef_search: int = 128  # DPR: 128
    nlist: int | None = None  # ivf_pq inverted lists; None: 4 * sqrt(number of vectors)
    nprobe: int = 64  # ivf_pq lists searched per query
    pq_m: int = 64  # ivf_pq bytes per vector (must divide the dimension)
    opq: bool = False  # ivf_pq: learn a rotation first (OPQ), usually better recall at the same size
    train_size: int = 200_000  # vectors sampled to train hnsw_sq8 / ivf_pq
    memory_gb: float | None = None  # auto: the budget for the index in RAM
    num_shards: int = 1  # index files over contiguous parts of the passages, searched together
    part: int | None = None  # build only this part of num_shards (one process or machine each); None: all parts

    def __post_init__(self):
        self.type = IndexType.parse(self.type, "index type")
        self.metric = Metric.parse(self.metric, "index metric")
        if self.type == IndexType.auto and not self.memory_gb:
            raise ValueError("index.type=auto needs index.memory_gb (the RAM the index may take)")
        if self.part is not None and not 0 <= self.part < self.num_shards:
            raise ValueError(f"index.part must be in 0..{self.num_shards - 1} (index.num_shards={self.num_shards}), got {self.part}")
        for name in ("hnsw_m", "ef_construction", "ef_search", "nprobe", "pq_m", "train_size", "num_shards"):
            if getattr(self, name) < 1:
                raise ValueError(f"index.{name} must be >= 1, got {getattr(self, name)}")

    def lists(self, count: int) -> int:
        return min(count, self.nlist or max(1, int(4 * math.sqrt(count))))

    @staticmethod
    def pq_bits(count: int) -> int:
        """8 bits (256 centroids) per sub-vector, fewer when there are too few vectors to train
        them with FAISS's 39 points per centroid (under 9,984 vectors)."""
        return max(1, min(8, int(math.log2(max(count / 39, 2)))))

    def factory(self, dim: int, count: int) -> str:
        """The `faiss.index_factory` description of this (resolved) type."""
        if self.type == IndexType.flat:
            return "Flat"
        if self.type == IndexType.hnsw:
            return f"HNSW{self.hnsw_m},Flat"
        if self.type == IndexType.hnsw_sq8:
            return f"HNSW{self.hnsw_m},SQ8"
        if self.type == IndexType.ivf_pq:
            if dim % self.pq_m:
                raise ValueError(f"index.pq_m={self.pq_m} must divide the vector width {dim}")
            if self.opq and count < 1024:
                raise ValueError(f"index.opq needs at least 1024 vectors to train its rotation, got {count}")
            rotation = f"OPQ{self.pq_m}," if self.opq else ""
            return f"{rotation}IVF{self.lists(count)},PQ{self.pq_m}x{self.pq_bits(count)}"
        raise ValueError(f"index type {self.type} has no FAISS layout (resolve auto first)")

    @property
    def needs_training(self) -> bool:
        return self.type in (IndexType.hnsw_sq8, IndexType.ivf_pq)


@dataclass
class SearchSettings:
    """How a built index is searched: set when it is loaded, without rebuilding it (evaluate's
    `search.ef_search`, `search.nprobe`). None keeps what the index was built with
    (`index.ef_search`, `index.nprobe` of build_index, recorded in its `index.json`)."""

    ef_search: int | None = None  # hnsw, hnsw_sq8: candidates kept per query (more: better recall, slower)
    nprobe: int | None = None  # ivf_pq: inverted lists searched per query

    def __post_init__(self):
        for name, value in asdict(self).items():
            if value is not None and value < 1:
                raise ValueError(f"search.{name} must be >= 1, got {value}")

    def given(self) -> dict[str, int]:
        return {name: value for name, value in asdict(self).items() if value is not None}

    def apply(self, config: IndexConfig) -> IndexConfig:
        """`config` with these settings in place of the built ones."""
        return replace(config, **self.given())


def estimated_bytes(config: IndexConfig, index_type: IndexType, dim: int, count: int) -> int:
    """RAM of an index of `count` vectors of width `dim` (FAISS's layouts; within ~10%)."""
    graph = count * (2 * config.hnsw_m * 4 * 1.07 + 8)  # level 0 holds 2M links, upper levels ~7% more
    if index_type == IndexType.flat:
        size = count * dim * 4
    elif index_type == IndexType.hnsw:
        size = count * dim * 4 + graph
    elif index_type == IndexType.hnsw_sq8:
        size = count * dim + graph
    elif index_type == IndexType.ivf_pq:
        codebooks = 256 * dim * 4 + config.lists(count) * dim * 4 + (dim * dim * 4 if config.opq else 0)
        size = count * (config.pq_m + 8) + codebooks  # codes + ids in the inverted lists
    else:
        raise ValueError(f"no estimate for index type {index_type}")
    return int(size)


def estimates(config: IndexConfig, dim: int, count: int) -> dict[str, float]:
    """GB of every concrete type, most accurate first."""
    return {str(t): estimated_bytes(config, t, dim, count) / 1e9 for t in BY_ACCURACY}


def choose(config: IndexConfig, dim: int, count: int) -> IndexType:
    """`auto`: the most accurate type that fits `memory_gb`; a concrete type as it is."""
    if config.type != IndexType.auto:
        return config.type
    sizes = estimates(config, dim, count)
    for t in BY_ACCURACY:
        if sizes[str(t)] <= config.memory_gb:
            return t
    raise ValueError(f"no index type fits index.memory_gb={config.memory_gb} for {count} vectors of width {dim}: "
                     + ", ".join(f"{t} {gb:.1f} GB" for t, gb in sizes.items()))
