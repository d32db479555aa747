"""Room for every vector before the first is added, so that an index's peak memory while it is
built is its final size (plus one chunk), not twice that.

FAISS grows an index's storage as a vector does: past its capacity it allocates twice the size
and copies, so adding 21M passages one chunk at a time peaks near twice the final index (60 GB of
flat vectors: ~117 GB at the last doubling). `reserve(index, count)` gives each growing buffer its
final capacity first: resizing a buffer to its final length and back to empty allocates exactly
that much once and keeps it (`std::vector` keeps its capacity when it shrinks), and the adds then
fill it without reallocating.

- flat and scalar-quantised storage (`flat`, the vectors of `hnsw`, `hnsw_sq8`): the codes buffer,
  count x code size;
- HNSW's graph: its neighbour table, whose size depends on the random levels drawn as vectors are
  added; reserved at its expectation (levels are geometric with ratio 1/M) plus a margin, so a
  graph that outgrows it is rare and grows once;
- inverted lists (`ivf_pq`): each list at its final length, counted in a pass that assigns every
  vector to its list (`list_sizes`) before any is added.
"""

from __future__ import annotations

import ctypes
import logging
import platform

import faiss
import numpy as np

log = logging.getLogger(__name__)

GRAPH_MARGIN = 1.01  # over the expected neighbour table: the drawn levels' sum is within ~0.1% of it at 1M nodes


def _grow_capacity(buffer, length: int) -> None:
    """Allocate `length` elements of capacity in a FAISS vector, leaving its contents as they are."""
    size = buffer.size()
    if length > size:
        kept = faiss.vector_to_array(buffer) if size else None
        buffer.resize(int(length))
        buffer.resize(0)
        if kept is not None:
            faiss.copy_array_to_vector(kept, buffer)


def expected_neighbours(hnsw, count: int) -> int:
    """Expected neighbour-table entries of `count` more nodes: a node drawn at level L holds
    cum_nneighbor_per_level[L + 1] entries, with probability assign_probas[L]."""
    probabilities = faiss.vector_to_array(hnsw.assign_probas)
    cumulative = faiss.vector_to_array(hnsw.cum_nneighbor_per_level)
    return int(np.ceil(count * float(np.dot(probabilities, cumulative[1 : len(probabilities) + 1]))))


def reserve(index: faiss.Index, count: int, list_sizes: np.ndarray | None = None) -> None:
    """Give `index` the capacity to take `count` more vectors without growing (see the module notes)."""
    index = faiss.downcast_index(index)
    if isinstance(index, faiss.IndexPreTransform):
        reserve(index.index, count, list_sizes)
    elif isinstance(index, faiss.IndexHNSW):
        reserve(index.storage, count)
        hnsw = index.hnsw
        _grow_capacity(hnsw.neighbors, hnsw.neighbors.size() + int(expected_neighbours(hnsw, count) * GRAPH_MARGIN))
    elif isinstance(index, faiss.IndexFlatCodes):
        _grow_capacity(index.codes, (index.ntotal + count) * index.code_size)
    elif isinstance(index, faiss.IndexIVF):
        if list_sizes is None:
            log.warning("no list sizes given: the inverted lists of %s grow as vectors are added", type(index).__name__)
            return
        lists = faiss.downcast_InvertedLists(index.invlists)
        for number, size in enumerate(np.asarray(list_sizes)):
            if size:
                current = lists.list_size(number)
                lists.resize(number, current + int(size))
                lists.resize(number, current)
    else:
        log.warning("no reservation for a %s index: it grows as vectors are added", type(index).__name__)


def release_freed_memory() -> bool:
    """Hand the heap's freed pages back to the kernel (glibc's `malloc_trim`); True if it ran.

    Training k-means and assigning a pass of chunks free tens of MB of work buffers that glibc
    keeps mapped below its (dynamic) mmap threshold; without this, an index build's adding phase
    starts that much above where it could (`benchmarks/index/peak_memory_results.md`)."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        return False
    return True


def ivf_of(index: faiss.Index) -> faiss.IndexIVF | None:
    index = faiss.downcast_index(index)
    if isinstance(index, faiss.IndexPreTransform):
        return ivf_of(index.index)
    return index if isinstance(index, faiss.IndexIVF) else None


def list_assignments(index: faiss.Index, vectors: np.ndarray) -> np.ndarray:
    """The inverted list each vector goes to (after the index's pre-transform, e.g. OPQ)."""
    outer = faiss.downcast_index(index)
    x = np.ascontiguousarray(vectors, dtype=np.float32)
    if isinstance(outer, faiss.IndexPreTransform):
        for step in range(outer.chain.size()):
            x = outer.chain.at(step).apply(x)
    _, assigned = ivf_of(index).quantizer.search(x, 1)
    return assigned[:, 0]
