"""A node that crashes right after a rename: outputs reach the disk before their names do, and a
resume reads back what it trusts (the last encoded chunk, the checkpoint) and falls back when it
does not load, instead of counting a short file as done."""

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import tiny_model_cfg
from safetensors.torch import load_file

import taser.io as io_module
from taser.io import atomic_dir, atomic_open
from taser.pipeline.encode import encode_corpus
from taser.pipeline.train import run_training
from taser.retrieval.embeddings import read_embeddings, shard_dir


@pytest.fixture
def synced(monkeypatch):
    """Each fsync's target path, and whether the final name existed at that moment."""
    calls = []
    real = os.fsync

    def record(fd):
        calls.append(Path(os.readlink(f"/proc/self/fd/{fd}")))
        return real(fd)

    monkeypatch.setattr(io_module.os, "fsync", record)
    return calls


def test_a_file_is_flushed_before_its_rename_and_its_directory_after(tmp_path, synced):
    target = tmp_path / "out" / "result.json"
    with atomic_open(target) as f:
        f.write("{}")
        tmp = Path(f.name)
    assert synced[0] == tmp  # the data, under its temporary name (before the rename)
    assert synced[-1] == target.parent  # the rename itself
    assert target.read_text() == "{}"


def test_a_directory_is_flushed_file_by_file_before_its_rename(tmp_path, synced):
    target = tmp_path / "model"
    with atomic_dir(target) as tmp:
        (tmp / "a.bin").write_bytes(b"a")
        (tmp / "sub").mkdir()
        (tmp / "sub" / "b.bin").write_bytes(b"b")
    flushed = {p.relative_to(tmp) if p.is_relative_to(tmp) else p for p in synced}
    assert {Path("a.bin"), Path("sub/b.bin"), Path("sub"), Path(".")} <= flushed
    assert synced[-1] == tmp_path


def test_atomic_dir_keeps_the_old_directory_as_previous_when_asked(tmp_path):
    for text in ("one", "two", "three"):
        with atomic_dir(tmp_path / "ckpt", previous=tmp_path / "ckpt.previous") as tmp:
            (tmp / "f").write_text(text)
    assert (tmp_path / "ckpt" / "f").read_text() == "three"
    assert (tmp_path / "ckpt.previous" / "f").read_text() == "two"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "ckpt.previous"]


@pytest.fixture(scope="module")
def checkpoint(tiny_pretrained, tmp_path_factory):
    from taser.pipeline.experiment import save_initial

    return save_initial(tiny_model_cfg(tiny_pretrained, "shared"), tmp_path_factory.mktemp("ckpt"))


@pytest.mark.parametrize("damage", ["empty", "short", "other rows"])
def test_an_encoding_resumed_after_a_crash_encodes_its_truncated_chunks_again(checkpoint, mini_squad, tmp_path, damage):
    whole = tmp_path / "whole"
    encode_corpus(checkpoint, mini_squad / "passages.tsv", whole, 0, 1, chunk_size=64, progress=False, precision="fp32", device="cpu")
    expected = read_embeddings(whole)
    out = tmp_path / "crashed"
    encode_corpus(checkpoint, mini_squad / "passages.tsv", out, 0, 1, chunk_size=64, progress=False, precision="fp32", device="cpu")
    folder = shard_dir(out, 0, 1)
    manifest = json.loads((folder / "manifest.json").read_text())
    (folder / "manifest.json").write_text(json.dumps({**manifest, "complete": False}))  # the crash came before the shard's end
    chunks = sorted(folder.glob("chunk_*.npz"))
    for chunk in chunks[-2:]:  # the last two renames' data never reached the disk
        size = chunk.stat().st_size
        if damage == "other rows":  # whole, but not this chunk's rows (a file from elsewhere)
            np.savez(chunk, vectors=np.zeros((3, 8), dtype=np.float32), ids=np.array(["a", "b", "c"]))
            continue
        with open(chunk, "r+b") as f:
            f.truncate(0 if damage == "empty" else size // 2)
    rows_lost = len(expected[1]) - 64 * (len(chunks) - 2)
    result = encode_corpus(checkpoint, mini_squad / "passages.tsv", out, 0, 1, chunk_size=64, progress=False, precision="fp32", device="cpu")
    assert result["encoded_now"] == rows_lost
    vectors, ids = read_embeddings(out)
    assert ids == expected[1]
    np.testing.assert_allclose(vectors, expected[0], rtol=1e-5, atol=1e-6)


TRAIN = dict(batch_size=4, hard_negatives=1, learning_rate=1e-3, warmup_steps=1, max_steps=4, log_every=1, save_every=1,
             val_max_questions=0, progress=False, seed=3, precision="fp32", device="cpu")


def _crash_at(stop):
    def crash(step, record):
        if step == stop:
            raise KeyboardInterrupt

    return crash


@pytest.mark.parametrize("damaged", [["trainer_state.pt"], ["model.safetensors"], []])
def test_a_resume_falls_back_to_the_previous_checkpoint_when_the_last_does_not_load(tmp_path, tiny_pretrained, mini_squad, damaged):
    model, files = tiny_model_cfg(tiny_pretrained), [str(mini_squad / "train.json")]
    run_training(model, files, TRAIN, tmp_path / "straight")
    with pytest.raises(KeyboardInterrupt):
        run_training(model, files, TRAIN, tmp_path / "run", on_step=_crash_at(3))  # after the checkpoint of step 3
    assert torch.load(tmp_path / "run" / "checkpoint.previous" / "trainer_state.pt", weights_only=False)["step"] == 2
    for name in damaged:  # written just before a node crash: the name is there, half of the data is not
        path = tmp_path / "run" / "checkpoint" / name
        with open(path, "r+b") as f:
            f.truncate(path.stat().st_size // 2)
    steps = []
    resumed = run_training(model, files, {**TRAIN, "resume": True}, tmp_path / "run", on_step=lambda step, record: steps.append(step))
    assert steps == ([3, 4] if damaged else [4])  # from step 2's checkpoint, or step 3's
    assert resumed.steps == 4
    a, b = load_file(str(tmp_path / "straight" / "final" / "model.safetensors")), load_file(str(tmp_path / "run" / "final" / "model.safetensors"))
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0, msg=k)


def test_a_resume_whose_checkpoints_both_fail_to_load_starts_over(tmp_path, tiny_pretrained, mini_squad):
    model, files = tiny_model_cfg(tiny_pretrained), [str(mini_squad / "train.json")]
    with pytest.raises(KeyboardInterrupt):
        run_training(model, files, TRAIN, tmp_path / "run", on_step=_crash_at(3))
    for folder in ("checkpoint", "checkpoint.previous"):
        (tmp_path / "run" / folder / "trainer_state.pt").write_bytes(b"")
    steps = []
    run_training(model, files, {**TRAIN, "resume": True}, tmp_path / "run", on_step=lambda step, record: steps.append(step))
    assert steps == [1, 2, 3, 4]


def test_a_stage_clears_what_killed_writers_left_before_and_after_its_build(tmp_path):
    """A kill during an index save left its 60 GB temporary directory, and nothing cleared it."""
    from taser.pipeline.stages import DONE_FILE, StageStore, stage_key

    store = StageStore(tmp_path, poll_s=0.01)
    key = stage_key("squad", {"a": 1}, {})
    left = tmp_path / key / "index" / ".index.faiss.k3j2.tmp"  # a killed first attempt's partial save
    left.parent.mkdir(parents=True)
    left.write_bytes(b"x" * 100)
    (tmp_path / key / ".checkpoint.a1b2.old").mkdir()
    seen = []

    def build(d):
        seen.append(sorted(p.name for p in d.rglob("*")))
        (d / "index" / "index.faiss").write_bytes(b"the index")
        (d / ".model.safetensors.zz9.tmp").write_bytes(b"a writer killed during this build")  # e.g. a torchrun rank's

    stage = store.run("squad", {"a": 1}, {}, build)
    assert seen == [["index", "stage-request.json"]]  # cleared before the build
    assert sorted(p.relative_to(stage.dir).as_posix() for p in stage.dir.rglob("*")) == sorted([DONE_FILE, "index", "index/index.faiss",
                                                                                                 "stage-request.json"])


def test_an_index_found_whole_clears_the_embeddings_a_kill_left_beside_it(checkpoint, mini_squad, tmp_path):
    from taser.pipeline.evaluate import dense_index

    index = dense_index(checkpoint, mini_squad / "passages.tsv", tmp_path, precision="fp32", device="cpu")
    (tmp_path / "embeddings" / "shard_000_of_001").mkdir(parents=True)  # killed after the index's save, before their removal
    (tmp_path / "embeddings" / "shard_000_of_001" / "chunk_000000.npz").write_bytes(b"vectors")
    assert dense_index(checkpoint, mini_squad / "passages.tsv", tmp_path, precision="fp32", device="cpu") == index
    assert not (tmp_path / "embeddings").exists()


def test_a_run_on_another_gpu_than_the_first_saves_and_restores_that_gpus_generator(monkeypatch):
    """A single process on cuda:3 (cuda:0 the current device) saved and restored cuda:0's generator."""
    from taser.training import checkpoint

    asked = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device="cuda": asked.append(("get", str(device))) or torch.zeros(1))
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, device="cuda": asked.append(("set", str(device))))

    from types import SimpleNamespace

    on_gpu3 = SimpleNamespace(parameters=lambda: iter([SimpleNamespace(device=torch.device("cuda", 3))]))
    state = checkpoint.rng_state(checkpoint._gpu_of(on_gpu3))
    checkpoint.set_rng_state(state, torch.device("cuda", 3))
    assert asked == [("get", "cuda:3"), ("set", "cuda:3")]
