"""FAISS indexes over passage vectors, saved with their id mapping.

`flat`: exact inner product. `hnsw`: HNSW graph with inner-product metric; DPR used 512
neighbours per node, efConstruction 200 and efSearch 128. For `l2` similarity the L2 metric is
used instead. An index directory holds `index.faiss`, `ids.json` and `index.json` (settings).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import faiss
import numpy as np

from taser.choice import Choice
from taser.io import atomic_dir


class IndexType(Choice):
    flat = "flat"  # exact
    hnsw = "hnsw"  # HNSW graph over the full vectors


class Metric(Choice):
    ip = "ip"  # inner product: dot and cosine similarity
    l2 = "l2"


INDEX_TYPES = IndexType.names()


@dataclass
class IndexConfig:
    type: IndexType = IndexType.flat
    metric: Metric = Metric.ip
    hnsw_m: int = 512
    ef_construction: int = 200
    ef_search: int = 128

    def __post_init__(self):
        self.type = IndexType.parse(self.type, "index type")
        self.metric = Metric.parse(self.metric, "index metric")


class PassageIndex:
    def __init__(self, index: faiss.Index, ids: list[str], config: IndexConfig):
        if index.ntotal != len(ids):
            raise ValueError(f"index holds {index.ntotal} vectors but {len(ids)} ids")
        self.index, self.ids, self.config = index, ids, config

    @classmethod
    def build(cls, vectors: np.ndarray, ids: list[str], config: IndexConfig, batch: int = 100_000) -> PassageIndex:
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        if vectors.ndim != 2 or len(vectors) != len(ids):
            raise ValueError(f"expected {len(ids)} vectors in a 2-D array, got shape {vectors.shape}")
        metric = faiss.METRIC_INNER_PRODUCT if config.metric == "ip" else faiss.METRIC_L2
        dim = vectors.shape[1]
        if config.type == "flat":
            index = faiss.IndexFlatIP(dim) if metric == faiss.METRIC_INNER_PRODUCT else faiss.IndexFlatL2(dim)
        else:
            index = faiss.IndexHNSWFlat(dim, config.hnsw_m, metric)
            index.hnsw.efConstruction = config.ef_construction
            index.hnsw.efSearch = config.ef_search
        for start in range(0, len(vectors), batch):
            index.add(vectors[start : start + batch])
        return cls(index, list(ids), config)

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, list[list[str]]]:
        """Scores [n, k'] (higher is better) and passage ids, k' = min(k, size)."""
        k = min(k, self.index.ntotal)
        if isinstance(self.index, faiss.IndexHNSW):
            self.index.hnsw.efSearch = max(self.config.ef_search, k)
        distances, rows = self.index.search(np.ascontiguousarray(queries, dtype=np.float32), k)
        scores = -distances if self.config.metric == "l2" else distances
        return scores, [[self.ids[r] for r in row if r >= 0] for row in rows]

    def save(self, directory: str | os.PathLike) -> None:
        with atomic_dir(directory) as tmp:
            faiss.write_index(self.index, str(tmp / "index.faiss"))
            (tmp / "ids.json").write_text(json.dumps(self.ids))
            (tmp / "index.json").write_text(json.dumps({**asdict(self.config), "size": len(self.ids), "dim": self.index.d}, indent=2))

    @classmethod
    def load(cls, directory: str | os.PathLike) -> PassageIndex:
        directory = Path(directory)
        meta_file = directory / "index.json"
        if not meta_file.is_file():
            raise FileNotFoundError(f"not an index directory (no index.json): {directory}")
        meta = json.loads(meta_file.read_text())
        config = IndexConfig(**{k: v for k, v in meta.items() if k not in ("size", "dim")})
        index = faiss.read_index(str(directory / "index.faiss"))
        return cls(index, json.loads((directory / "ids.json").read_text()), config)


def metric_for(similarity: str) -> str:
    return "l2" if similarity == "l2" else "ip"
