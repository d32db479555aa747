"""FAISS indexes: streamed building equals the in-memory build, every index type end to end,
size estimates and `auto`, compact ids, and the passages-file check."""

import numpy as np
import pytest
from conftest import tiny_model_cfg

from taser.pipeline.encode import encode_corpus
from taser.pipeline.index import build_index
from taser.retrieval.embeddings import check_same_passages, read_embeddings
from taser.retrieval.faiss_index import PassageIndex, ShardedIndex, load_index
from taser.retrieval.index_types import IndexConfig, IndexType, choose, estimated_bytes, estimates

TYPES = ["flat", "hnsw", "hnsw_sq8", "ivf_pq"]


@pytest.fixture(scope="module")
def embeddings(tiny_pretrained, mini_squad, tmp_path_factory):
    from taser.pipeline.experiment import save_initial

    out = tmp_path_factory.mktemp("index")
    ckpt = save_initial(tiny_model_cfg(tiny_pretrained, "shared"), out / "ckpt")
    for k in range(2):
        encode_corpus(ckpt, mini_squad / "passages.tsv", out / "emb", k, 2, chunk_size=50, progress=False)
    return out / "emb"


def clustered(n: int, dim: int = 64, seed: int = 0) -> np.ndarray:
    """Vectors with few directions of variation, as embeddings have (i.i.d. Gaussian vectors in
    64 dimensions are almost equidistant: no approximate index can rank them)."""
    mixing = np.random.default_rng(99).normal(size=(8, dim))  # shared by base and queries
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(n, 8)) @ mixing + 0.05 * rng.normal(size=(n, dim))).astype(np.float32)


def test_streamed_flat_equals_the_in_memory_build(embeddings, tmp_path):
    build_index(embeddings, tmp_path / "idx", IndexConfig("flat"))
    streamed = PassageIndex.load(tmp_path / "idx")
    vectors, ids = read_embeddings(embeddings)
    whole = PassageIndex.build(vectors, ids, IndexConfig("flat"))
    scores_a, ids_a = streamed.search(vectors[:20], 10)
    scores_b, ids_b = whole.search(vectors[:20], 10)
    assert ids_a == ids_b and np.array_equal(scores_a, scores_b)
    assert streamed.ids == ids and streamed.meta["passages"]["rows"] == len(ids)


@pytest.mark.parametrize("kind", TYPES)
def test_every_type_end_to_end(embeddings, mini_squad, tmp_path, kind):
    result = build_index(embeddings, tmp_path / kind, IndexConfig(kind, hnsw_m=8, pq_m=16, nprobe=8))
    assert result["type"] == kind
    index = PassageIndex.load(tmp_path / kind)
    assert index.config.type == kind and index.index.ntotal == result["passages"]
    scores, ids = index.search(read_embeddings(embeddings)[0][:5], 7)
    assert scores.shape == (5, 7) and all(len(row) == 7 for row in ids)
    check_same_passages(index.meta["passages"], mini_squad / "passages.tsv", "the index")


def test_training_sample_is_the_drawn_rows_in_order_across_chunks():
    from taser.retrieval.faiss_index import _training_sample

    vectors = np.arange(103 * 4, dtype=np.float16).reshape(103, 4)
    cuts = [0, 7, 50, 51, 103]  # uneven chunks, one of a single row

    def chunks():
        return ((vectors[a:b], np.arange(a, b)) for a, b in zip(cuts, cuts[1:]))

    sample = _training_sample(chunks, 103, 4, 40, seed=3)
    wanted = np.sort(np.random.default_rng(3).choice(103, size=40, replace=False))
    assert sample.dtype == np.float32 and np.array_equal(sample, vectors[wanted].astype(np.float32))
    assert np.array_equal(_training_sample(chunks, 103, 4, 500), vectors.astype(np.float32))  # more asked than there are: all
    with pytest.raises(ValueError, match="expected 104 vectors, the chunks held 103"):
        _training_sample(chunks, 104, 4, 40)


@pytest.mark.parametrize("kind, opq, recall", [("hnsw", False, 0.95), ("hnsw_sq8", False, 0.9), ("ivf_pq", False, 0.5), ("ivf_pq", True, 0.5)])
def test_approximate_types_find_the_exact_neighbours(kind, opq, recall):
    base, queries = clustered(2000), clustered(50, seed=1)
    ids = [str(i) for i in range(len(base))]
    exact = PassageIndex.build(base, ids, IndexConfig("flat")).search(queries, 10)[1]
    approx = PassageIndex.build(base, ids, IndexConfig(kind, hnsw_m=16, pq_m=16, nlist=32, nprobe=8, opq=opq)).search(queries, 10)[1]
    found = np.mean([len(set(a) & set(e)) / 10 for a, e in zip(approx, exact)])
    assert found >= recall, (kind, found)


def test_size_estimates_and_auto():
    cfg = IndexConfig()
    gb = estimates(cfg, 768, 21_015_324)
    assert gb["flat"] == pytest.approx(64.56, abs=0.01)  # 21,015,324 x 768 x 4 bytes
    assert gb["flat"] < gb["hnsw"] and gb["hnsw_sq8"] < gb["hnsw"] and gb["ivf_pq"] < 4
    assert estimated_bytes(IndexConfig(hnsw_m=512), IndexType.hnsw, 768, 21_015_324) / 1e9 > 150  # DPR's M=512
    assert choose(IndexConfig("auto", memory_gb=100), 768, 21_015_324) == "flat"
    assert choose(IndexConfig("auto", memory_gb=32), 768, 21_015_324) == "hnsw_sq8"
    assert choose(IndexConfig("auto", memory_gb=4), 768, 21_015_324) == "ivf_pq"
    with pytest.raises(ValueError, match="no index type fits index.memory_gb=0.1"):
        choose(IndexConfig("auto", memory_gb=0.1), 768, 21_015_324)
    with pytest.raises(ValueError, match="index.type=auto needs index.memory_gb"):
        IndexConfig("auto")
    with pytest.raises(ValueError, match="pq_m=48 must divide the vector width 64"):
        IndexConfig("ivf_pq", pq_m=48).factory(64, 1000)


def test_ids_are_compact_and_round_trip(tmp_path):
    vectors = clustered(30)
    numeric = PassageIndex.build(vectors, [str(i + 1) for i in range(30)], IndexConfig("flat"))
    assert numeric._ids.dtype == np.int64
    named = PassageIndex.build(vectors, [f"doc-{i}" for i in range(29)] + ["007"], IndexConfig("flat"))
    assert named._ids.dtype.kind == "S"
    for index, name in ((numeric, "n"), (named, "s")):
        index.save(tmp_path / name)
        loaded = PassageIndex.load(tmp_path / name)
        assert loaded.ids == index.ids and loaded.search(vectors[:3], 5)[1] == index.search(vectors[:3], 5)[1]
    assert named.ids[-1] == "007"  # not a canonical number: kept as written


def test_an_index_of_other_passages_is_refused(embeddings, mini_squad, tmp_path):
    build_index(embeddings, tmp_path / "idx", IndexConfig("flat"))
    other = tmp_path / "other.tsv"
    other.write_text((mini_squad / "passages.tsv").read_text() + "9999\tone more passage\tTitle\n")
    with pytest.raises(ValueError, match="built from another passages file"):
        check_same_passages(PassageIndex.load(tmp_path / "idx").meta["passages"], other, "the index")


@pytest.mark.parametrize("parts", [2, 3])
def test_sharded_flat_search_equals_one_index(embeddings, tmp_path, parts):
    build_index(embeddings, tmp_path / "one", IndexConfig("flat"))
    build_index(embeddings, tmp_path / "parts", IndexConfig("flat", num_shards=parts))
    one, sharded = load_index(tmp_path / "one"), load_index(tmp_path / "parts")
    assert isinstance(sharded, ShardedIndex) and len(sharded.parts) == parts
    assert sorted(p.name for p in (tmp_path / "parts").glob("part_*")) == [f"part_{s:03d}" for s in range(parts)]
    assert sharded.ids == one.ids and sharded.meta["passages"] == one.meta["passages"]
    queries = clustered(12)
    scores_one, ids_one = one.search(queries, 10)
    scores_parts, ids_parts = sharded.search(queries, 10)
    assert ids_parts == ids_one
    np.testing.assert_allclose(scores_parts, scores_one, rtol=1e-6)


def test_parts_built_by_separate_processes_search_as_one_index(embeddings, tmp_path):
    build_index(embeddings, tmp_path / "one", IndexConfig("flat"))
    for part in (2, 0, 1):  # any order, one call (process, machine) each
        build_index(embeddings, tmp_path / "parts", IndexConfig("flat", num_shards=3, part=part))
    assert not (tmp_path / "parts" / "index.json").exists()
    one, parts = load_index(tmp_path / "one"), load_index(tmp_path / "parts")
    assert isinstance(parts, ShardedIndex) and parts.ids == one.ids
    queries = clustered(12)
    assert parts.search(queries, 10)[1] == one.search(queries, 10)[1]


def test_missing_or_mismatched_parts_are_refused(embeddings, tmp_path):
    build_index(embeddings, tmp_path / "parts", IndexConfig("flat", num_shards=3, part=0))
    with pytest.raises(ValueError, match=r"part\(s\) \[1, 2\] of 3 are missing"):
        load_index(tmp_path / "parts")
    build_index(embeddings, tmp_path / "parts", IndexConfig("flat", num_shards=2, part=1))
    build_index(embeddings, tmp_path / "parts", IndexConfig("flat", num_shards=3, part=2))
    with pytest.raises(ValueError, match="does not continue the parts before it"):
        load_index(tmp_path / "parts")
    with pytest.raises(ValueError, match=r"index.part must be in 0..2"):
        IndexConfig("flat", num_shards=3, part=3)


def test_sharded_trained_index_shares_its_training(embeddings, tmp_path):
    build_index(embeddings, tmp_path / "sq8", IndexConfig("hnsw_sq8", hnsw_m=8, num_shards=2))
    index = load_index(tmp_path / "sq8")
    scores, ids = index.search(read_embeddings(embeddings)[0][:4], 5)
    assert scores.shape == (4, 5) and all(len(row) == 5 for row in ids)
