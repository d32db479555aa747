"""`taser.retrieval.index_memory` in this process (the peak-memory tests build indexes in child
processes, where a mutation tool's coverage pass does not see them): after `reserve`, adding the
reserved vectors never moves a buffer (its storage pointer stays put: FAISS did not reallocate),
what was already in the buffer is kept, and the same adds without it do move the buffer."""

import numpy as np
import pytest

faiss = pytest.importorskip("faiss")

from taser.retrieval.index_memory import ivf_of, list_assignments, release_freed_memory, reserve  # noqa: E402

DIM = 8


def vectors(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random((n, DIM), dtype=np.float32)


def address(buffer) -> int:
    """Where a FAISS vector's elements live (0 for none)."""
    return int(buffer.data() or 0)


def test_a_reserved_flat_index_takes_its_vectors_without_moving_and_keeps_what_it_held():
    index = faiss.IndexFlatIP(DIM)
    index.add(vectors(10))
    held = faiss.vector_to_array(index.codes).copy()
    reserve(index, 1000)
    assert index.ntotal == 10 and np.array_equal(faiss.vector_to_array(index.codes), held)  # contents kept
    before = address(index.codes)
    index.add(vectors(1000, seed=1))
    assert address(index.codes) == before
    plain = faiss.IndexFlatIP(DIM)
    plain.add(vectors(10))
    unreserved = address(plain.codes)
    plain.add(vectors(1000, seed=1))
    assert address(plain.codes) != unreserved  # without the reservation the same adds reallocate
    assert np.array_equal(faiss.vector_to_array(index.codes), faiss.vector_to_array(plain.codes))


def test_a_reserved_empty_flat_index_has_room_for_exactly_its_vectors():
    index = faiss.IndexFlatIP(DIM)
    reserve(index, 500)
    before = address(index.codes)
    assert before and index.codes.size() == 0
    index.add(vectors(500))
    assert address(index.codes) == before
    index.add(vectors(1, seed=2))  # one more than reserved: room ends where the reservation did
    assert address(index.codes) != before


def test_a_reserved_hnsw_index_keeps_its_graph_and_vectors_in_place():
    index = faiss.IndexHNSWFlat(DIM, 8)
    index.add(vectors(5))
    reserve(index, 2000)
    graph, stored = address(index.hnsw.neighbors), address(faiss.downcast_index(index.storage).codes)
    index.add(vectors(2000, seed=3))  # FAISS's level draws are seeded: the same graph every run
    assert address(index.hnsw.neighbors) == graph and address(faiss.downcast_index(index.storage).codes) == stored
    plain = faiss.IndexHNSWFlat(DIM, 8)
    plain.add(vectors(5))
    unreserved = address(plain.hnsw.neighbors)
    plain.add(vectors(2000, seed=3))
    assert address(plain.hnsw.neighbors) != unreserved


def ivf_index(pre_transform: bool):
    index = faiss.index_factory(DIM, "OPQ4,IVF4,Flat" if pre_transform else "IVF4,Flat", faiss.METRIC_INNER_PRODUCT)
    index.train(vectors(400, seed=4))
    return index


@pytest.mark.parametrize("pre_transform", [False, True])
def test_list_assignments_are_the_lists_the_index_puts_vectors_in(pre_transform):
    index, x = ivf_index(pre_transform), vectors(300, seed=5)
    assigned = list_assignments(index, x)
    index.add(x)
    lists = faiss.downcast_InvertedLists(ivf_of(index).invlists)
    assert [lists.list_size(i) for i in range(4)] == np.bincount(assigned, minlength=4).tolist()
    for number in range(4):
        ids = faiss.rev_swig_ptr(lists.get_ids(number), lists.list_size(number))
        assert set(ids.tolist()) == set(np.flatnonzero(assigned == number).tolist())
    assert ivf_of(faiss.IndexFlatIP(DIM)) is None


@pytest.mark.parametrize("pre_transform", [False, True])
def test_reserved_inverted_lists_take_their_vectors_without_moving(pre_transform):
    index, x = ivf_index(pre_transform), vectors(300, seed=6)
    index.add(x[:20])
    sizes = np.bincount(list_assignments(index, x[20:]), minlength=4)
    reserve(index, 280, sizes)
    lists = faiss.downcast_InvertedLists(ivf_of(index).invlists)
    assert sum(lists.list_size(i) for i in range(4)) == 20  # room, not vectors
    before = [int(lists.get_codes(i)) for i in range(4)]
    index.add(x[20:])
    assert [int(lists.get_codes(i)) for i in range(4)] == before
    plain = ivf_index(pre_transform)
    plain.add(x[:20])
    plain_lists = faiss.downcast_InvertedLists(ivf_of(plain).invlists)
    unreserved = [int(plain_lists.get_codes(i)) for i in range(4)]
    plain.add(x[20:])
    assert [int(plain_lists.get_codes(i)) for i in range(4)] != unreserved


def test_inverted_lists_without_sizes_are_left_to_grow_and_say_so(caplog):
    index = ivf_index(False)
    with caplog.at_level("WARNING"):
        reserve(index, 100)
    assert "no list sizes given" in caplog.text


def test_freed_memory_is_handed_back_on_glibc():
    import platform

    assert release_freed_memory() is (platform.system() == "Linux" and platform.libc_ver()[0] == "glibc")


def test_a_pre_transformed_flat_index_reserves_its_inner_storage():
    index = faiss.index_factory(DIM, "L2norm,Flat", faiss.METRIC_INNER_PRODUCT)
    reserve(index, 300)
    inner = faiss.downcast_index(faiss.downcast_index(index).index)
    before = address(inner.codes)
    index.add(vectors(300, seed=7))
    assert before and address(inner.codes) == before


def test_list_assignments_take_vectors_of_any_float_type():
    index, x = ivf_index(False), vectors(50, seed=8)
    assert np.array_equal(list_assignments(index, x.astype(np.float64)), list_assignments(index, x))


def test_an_index_without_a_reservation_is_named_in_the_warning(caplog):
    with caplog.at_level("WARNING"):
        reserve(faiss.IndexIDMap(faiss.IndexFlatIP(DIM)), 100)
        reserve(ivf_index(False), 100)
    assert caplog.messages == ["no reservation for a IndexIDMap index: it grows as vectors are added",
                               "no list sizes given: the inverted lists of IndexIVFFlat grow as vectors are added"]


def test_freed_memory_is_not_handed_back_off_glibc_or_without_malloc_trim(monkeypatch):
    import ctypes
    import platform

    monkeypatch.setattr(platform, "libc_ver", lambda *a, **k: ("musl", "1.2"))
    assert release_freed_memory() is False
    monkeypatch.undo()
    monkeypatch.setattr(platform, "system", lambda: "Darwin")
    assert release_freed_memory() is False
    monkeypatch.undo()

    def missing(name):
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(ctypes, "CDLL", missing)
    assert release_freed_memory() is False
