"""Sharded, resumable passage encoding: contiguous shards, resume after a real kill, the
manifests' checks, float16 vectors, one shard per torchrun rank."""

import json
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import ROOT, tiny_model_cfg

from taser.data.passage_store import PassageStore
from taser.data.passages import Passage, read_passages, write_passages
from taser.pipeline.encode import encode_corpus
from taser.retrieval.embeddings import ShardWriter, read_embeddings, read_manifests, shard_dir, shard_range


@pytest.fixture(scope="module")
def checkpoint(tiny_pretrained, tmp_path_factory):
    from taser.pipeline.experiment import save_initial

    return save_initial(tiny_model_cfg(tiny_pretrained, "shared"), tmp_path_factory.mktemp("ckpt"))


@pytest.fixture(scope="module")
def whole(checkpoint, mini_squad, tmp_path_factory):
    """The corpus encoded in one shard, in one run: what every other layout must equal."""
    out = tmp_path_factory.mktemp("whole") / "emb"
    encode_corpus(checkpoint, mini_squad / "passages.tsv", out, 0, 1, chunk_size=16, progress=False, precision="fp32", device="cpu")
    return read_embeddings(out)


def test_shard_ranges_are_contiguous_and_cover_every_row():
    for rows, n in ((10, 3), (7, 7), (21_015_324, 50)):
        ranges = [shard_range(rows, k, n) for k in range(n)]
        assert ranges[0][0] == 0 and ranges[-1][1] == rows
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
        assert max(e - s for s, e in ranges) - min(e - s for s, e in ranges) <= 1
    with pytest.raises(ValueError, match="shard_id must be in 0..2"):
        shard_range(10, 3, 3)


def test_read_rows_reads_a_range_in_file_order(tmp_path):
    passages = [Passage(str(i), f"text {i}" + ('\nwith "a quoted" line' if i % 3 == 0 else ""), f"T{i}") for i in range(10)]
    path = tmp_path / "p.tsv"
    write_passages(path, passages)
    with PassageStore(path) as store:
        assert store.read_rows(0, 10) == list(read_passages(path)) == passages
        assert store.read_rows(3, 7) == passages[3:7]
        assert store.read_rows(5, 5) == []
        with pytest.raises(IndexError, match="outside the 10 passages"):
            store.read_rows(8, 11)


def test_shards_together_equal_one_run(checkpoint, mini_squad, whole, tmp_path):
    out = tmp_path / "emb"
    for k in range(3):
        result = encode_corpus(checkpoint, mini_squad / "passages.tsv", out, k, 3, chunk_size=16, progress=False, precision="fp32", device="cpu")
        assert result["encoded_now"] == result["passages"] > 0
    vectors, ids = read_embeddings(out, mini_squad / "passages.tsv")
    assert ids == whole[1] == [p.id for p in read_passages(mini_squad / "passages.tsv")]
    np.testing.assert_allclose(vectors, whole[0], rtol=1e-5, atol=1e-6)
    # the same command again finds everything done and encodes nothing
    again = encode_corpus(checkpoint, mini_squad / "passages.tsv", out, 1, 3, chunk_size=16, progress=False, precision="fp32", device="cpu")
    assert again["encoded_now"] == 0


def test_one_shard_per_torchrun_rank(checkpoint, mini_squad, monkeypatch, tmp_path):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    encode_corpus(checkpoint, mini_squad / "passages.tsv", tmp_path / "emb", chunk_size=64, progress=False)
    assert [p.name for p in (tmp_path / "emb").iterdir()] == ["shard_001_of_002"]


KILLED_CHILD = """
import sys, time
from pathlib import Path
import taser.pipeline.encode as encode
real = encode.encode_ids
calls = 0
def held(*args, **kwargs):  # once chunks 0-2 are written (a thread writes them), say so and wait to be killed
    global calls
    calls += 1
    if calls == 4:
        chunk_2 = Path(sys.argv[3]) / "shard_000_of_001" / "chunk_000002.npz"
        deadline = time.time() + 60
        while not chunk_2.exists() and time.time() < deadline:
            time.sleep(0.01)
        Path(sys.argv[4]).touch()
        time.sleep(600)
        sys.exit("not killed")
    return real(*args, **kwargs)
encode.encode_ids = held
encode.encode_corpus(sys.argv[1], sys.argv[2], sys.argv[3], 0, 1, chunk_size=8, progress=False, precision="fp32", device="cpu")
"""


@pytest.mark.slow
def test_resume_after_a_kill_equals_an_uninterrupted_run(checkpoint, mini_squad, whole, tmp_path):
    """Would catch a re-run that starts over, or re-encodes chunks already on disk. The child holds
    after chunk 2 until killed (no timing window)."""
    out, ready = tmp_path / "emb", tmp_path / "ready"
    child = subprocess.Popen([sys.executable, "-c", KILLED_CHILD, checkpoint, str(mini_squad / "passages.tsv"), str(out), str(ready)], cwd=ROOT)
    deadline = time.time() + 120
    while not ready.exists():
        assert child.poll() is None and time.time() < deadline, "the child ended before it could be killed"
        time.sleep(0.02)
    child.send_signal(signal.SIGKILL)
    child.wait()
    chunks = sorted(shard_dir(out, 0, 1).glob("chunk_*.npz"))
    assert len(chunks) == 3  # killed mid-shard, after chunks 0-2
    with pytest.raises(ValueError, match="incomplete: run its encoding again"):
        read_embeddings(out)
    result = encode_corpus(checkpoint, mini_squad / "passages.tsv", out, 0, 1, chunk_size=8, progress=False, precision="fp32", device="cpu")
    assert result["encoded_now"] == len(whole[1]) - 8 * len(chunks)
    vectors, ids = read_embeddings(out)
    assert ids == whole[1]
    np.testing.assert_allclose(vectors, whole[0], rtol=1e-5, atol=1e-6)


@pytest.fixture
def three_shards(checkpoint, mini_squad, tmp_path):
    out = tmp_path / "emb"
    for k in range(3):
        encode_corpus(checkpoint, mini_squad / "passages.tsv", out, k, 3, chunk_size=64, progress=False)
    return out


def _edit_manifest(out, shard, **changes):
    path = shard_dir(out, shard, 3) / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest.update(changes)
    path.write_text(json.dumps(manifest))


def test_manifest_checks_refuse_what_is_not_one_whole(three_shards, checkpoint, mini_squad, tmp_path):
    out = three_shards
    read_manifests(out, mini_squad / "passages.tsv")  # whole
    cases = [
        (lambda: shutil.rmtree(shard_dir(out, 1, 3)), r"shard\(s\) \[1\] of 3 are missing"),
        (lambda: _edit_manifest(out, 2, complete=False), "incomplete"),
        (lambda: shard_dir(out, 0, 2).mkdir(), "mixes encodings into 2, 3 shards"),
        (lambda: _edit_manifest(out, 1, checkpoint={"name": "other"}), "shard 1 has checkpoint="),
        (lambda: _edit_manifest(out, 1, dtype="float16"), "shard 1 has dtype="),
        (lambda: _edit_manifest(out, 1, start=json.loads((shard_dir(out, 1, 3) / "manifest.json").read_text())["start"] + 1),
         r"shard 1 starts at row \d+, expected \d+ \(a gap or an overlap\)"),
        (lambda: [_edit_manifest(out, k, passages={**json.loads((shard_dir(out, k, 3) / "manifest.json").read_text())["passages"], "rows": 10**6})
                  for k in range(3)], "the shards hold .* passages, the passages file 1000000"),
    ]
    backup = tmp_path / "backup"
    shutil.copytree(out, backup)
    for spoil, message in cases:
        spoil()
        with pytest.raises(ValueError, match=message):
            read_manifests(out)
        shutil.rmtree(out)
        shutil.copytree(backup, out)
    other = tmp_path / "other.tsv"
    write_passages(other, list(read_passages(mini_squad / "passages.tsv"))[:-1])
    with pytest.raises(ValueError, match="another passages file"):
        read_manifests(out, other)
    with pytest.raises(FileNotFoundError, match="no shard_<k>_of_<n> folders"):
        read_manifests(tmp_path)


def test_resuming_with_other_settings_is_refused(three_shards, checkpoint, mini_squad):
    with pytest.raises(ValueError, match=r"written with other settings \(chunk_size, dtype differ\)"):
        encode_corpus(checkpoint, mini_squad / "passages.tsv", three_shards, 0, 3, chunk_size=32, dtype="float16", progress=False)
    with pytest.raises(ValueError, match="unknown vector dtype 'int8'"):
        ShardWriter(three_shards, {"shard_id": 0, "num_shards": 3, "dtype": "int8"})


def test_a_resume_in_another_precision_is_refused_before_any_work(checkpoint, mini_squad, tmp_path, monkeypatch):
    """Would catch a shard started in bf16 and finished in fp32 (or the reverse) accepted silently:
    precision must match to resume, as backend and dtype must."""
    import taser.pipeline.encode as encode

    out = tmp_path / "emb"
    encode_corpus(checkpoint, mini_squad / "passages.tsv", out, 0, 1, chunk_size=64, progress=False, precision="fp32", device="cpu")
    manifest = json.loads((out / "shard_000_of_001" / "manifest.json").read_text())
    assert manifest["precision"] == "fp32"
    (out / "shard_000_of_001" / "chunk_000001.npz").unlink()  # as if killed after the first chunk
    monkeypatch.setattr(encode, "load_checkpoint", lambda *a, **k: pytest.fail("the model was loaded before the refusal"))
    with pytest.raises(ValueError, match=r"written with other settings \(precision differ\)"):
        encode_corpus(checkpoint, mini_squad / "passages.tsv", out, 0, 1, chunk_size=64, progress=False, precision="bf16", device="cpu")


def test_evaluate_reuses_an_index_only_of_its_own_precision(checkpoint, mini_squad, tmp_path, monkeypatch):
    import taser.pipeline.encode as encode
    from taser.pipeline.evaluate import dense_index

    encoded = []
    real = encode.encode_corpus
    monkeypatch.setattr(encode, "encode_corpus", lambda *a, **k: encoded.append(k["precision"]) or real(*a, **k))
    for precision in ("fp32", "fp32", "bf16"):
        index = dense_index(checkpoint, mini_squad / "passages.tsv", tmp_path, precision=precision, device="cpu")
    assert encoded == ["fp32", "bf16"]  # the second fp32 call reused the first index; bf16 built its own
    assert json.loads((index / "index.json").read_text())["precision"] == "bf16"


@pytest.mark.slow
def test_float16_vectors_retrieve_the_same(mini_squad, tmp_path):
    """The real MiniLM (a tiny random model's vectors are too alike to rank by): float16 on disk,
    float32 in the index, and the questions' rankings unchanged."""
    from taser.data.qa import read_qa
    from taser.models.loading import load_checkpoint
    from taser.pipeline.experiment import save_initial
    from taser.retrieval.dense import dense_retrieve
    from taser.retrieval.faiss_index import PassageIndex
    from taser.retrieval.index_types import IndexConfig

    ckpt = save_initial({"model_type": "shared"}, tmp_path / "minilm")
    passages = tmp_path / "passages.tsv"  # the first 120 of the 240: encoded twice, the test's cost
    with open(mini_squad / "passages.tsv", encoding="utf-8") as f:
        passages.write_text("".join(f.readlines()[:121]), encoding="utf-8")
    rankings = {}
    for dtype in ("float32", "float16"):
        out = tmp_path / dtype
        encode_corpus(ckpt, passages, out, 0, 1, chunk_size=128, dtype=dtype, progress=False, precision="fp32", device="cpu")
        with np.load(shard_dir(out, 0, 1) / "chunk_000000.npz") as data:
            assert data["vectors"].dtype == dtype
        vectors, ids = read_embeddings(out)
        assert vectors.dtype == np.float32
        model, tokenizer = load_checkpoint(ckpt, device="cpu")
        questions = [q.question for q in read_qa(mini_squad / "dev.qa.tsv")][:200]
        hits = dense_retrieve(model, tokenizer, PassageIndex.build(vectors, ids, IndexConfig("flat")), questions, 5, precision="fp32")
        rankings[dtype] = [[pid for pid, _ in row] for row in hits]
    assert [r[0] for r in rankings["float16"]] == [r[0] for r in rankings["float32"]]
    same_top5 = sum(a == b for a, b in zip(rankings["float16"], rankings["float32"])) / len(rankings["float32"])
    assert same_top5 > 0.95
