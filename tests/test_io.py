"""Atomic outputs (`taser.io`) get the permissions the user's umask grants new files and
directories, as `open` and `mkdir` do, not `tempfile`'s private 0600 / 0700."""

from __future__ import annotations

import os
import stat

import pytest

from taser.io import atomic_dir, atomic_open, atomic_path, current_umask


@pytest.fixture(params=[0o022, 0o027, 0o002])
def umask(request):
    old = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(old)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_outputs_follow_the_umask(umask, tmp_path):
    assert current_umask() == umask
    with atomic_open(tmp_path / "results.json") as f:
        f.write("{}")
    with atomic_path(tmp_path / "vectors.npz") as tmp:
        tmp.write_bytes(b"x")
    with atomic_dir(tmp_path / "checkpoint") as tmp:
        (tmp / "config.json").write_text("{}")
        (tmp / "sub").mkdir()
    assert mode(tmp_path / "results.json") == mode(tmp_path / "vectors.npz") == 0o666 & ~umask
    assert mode(tmp_path / "checkpoint") == 0o777 & ~umask
    # what is made inside is as `open` and `mkdir` make it
    assert mode(tmp_path / "checkpoint" / "config.json") == 0o666 & ~umask and mode(tmp_path / "checkpoint" / "sub") == 0o777 & ~umask
    # a replaced directory too, and nothing temporary is left
    with atomic_dir(tmp_path / "checkpoint") as tmp:
        (tmp / "config.json").write_text("{}")
    assert mode(tmp_path / "checkpoint") == 0o777 & ~umask
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint", "results.json", "vectors.npz"]


def test_a_converted_checkpoint_is_readable_by_the_group(tiny_pretrained, tokenizer, tmp_path):
    """The issue's case: an import wrote its directory 0700 on a shared cluster."""
    from conftest import tiny_model_cfg

    from taser.models.loading import load_model
    from taser.pipeline.convert import convert_checkpoint

    old = os.umask(0o022)
    try:
        model, _ = load_model(tiny_model_cfg(tiny_pretrained, "shared"))
        model.save(tmp_path / "shared", tokenizer)
        out = convert_checkpoint("export_sentence_transformers", tmp_path / "shared", tmp_path / "st")
    finally:
        os.umask(old)
    assert mode(out) == 0o755 and mode(out / "modules.json") == 0o644 and mode(out / "model.safetensors") == 0o644
    assert mode(tmp_path / "shared") == 0o755
