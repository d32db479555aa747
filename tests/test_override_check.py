"""A mistyped setting on the command line is answered with the closest valid key, in one line and
exit status 2, before Hydra (or any model) loads: not Hydra's advice to add `+`, which fails later."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT

from taser.override_check import _schema_of, check_overrides, unknown_setting
from taser.shipped import CONFIG_DIR

GROUPS = {p.name for p in Path(CONFIG_DIR).iterdir() if p.is_dir()}


@pytest.mark.parametrize("config, key, said", [
    ("train", "train.batch_szie", "did you mean train.batch_size?"),
    ("train", "modle.pretrained", "did you mean model?"),
    ("train", "model.taser.routng", "did you mean model.taser.routing?"),
    ("experiment", "table.rows.dpr.nme", "did you mean table.rows.dpr.name?"),
    ("search", "retreiver", "did you mean retriever?"),
    ("gpu_check", "modles", "did you mean models?"),
    ("train_reader", "train.zzz", "train has "),
])
def test_a_mistyped_key_gets_the_closest_valid_one(config, key, said):
    assert said in unknown_setting(key, _schema_of(Path(CONFIG_DIR), config), GROUPS)


@pytest.mark.parametrize("config, key", [
    ("train", "train.batch_size"), ("train", "model"), ("train", "data.hub.qa"), ("experiment", "table.rows.dpr.train.batchsize"),
    ("experiment", "table.rows.new-row.model.model_type"), ("evaluate", "index_preset"), ("experiment", "table.train.max_steps"),
])
def test_valid_keys_groups_and_free_mappings_pass(config, key):
    assert unknown_setting(key, _schema_of(Path(CONFIG_DIR), config), GROUPS) is None


def test_hydras_own_additions_and_deletions_are_left_to_hydra(capsys):
    check_overrides(CONFIG_DIR, "train", ["+train.new_thing=1", "~train.batch_size", "hydra.run.dir=x", "hydra/launcher=basic", "--help"])
    with pytest.raises(SystemExit) as exit_:
        check_overrides(CONFIG_DIR, "train", ["train.batch_szie=8", "train.lr=1"])
    assert exit_.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[0] == "Error: unknown setting train.batch_szie: did you mean train.batch_size?" and "train.lr" in lines[1]


@pytest.mark.parametrize("script, mistyped", [("train", "train.batch_szie=8"), ("experiment", "tabel=squad_cpu"), ("search", "retreiver=bm25")])
def test_the_command_answers_in_one_line_within_seconds(script, mistyped, tmp_path):
    start = time.perf_counter()
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / f"{script}.py"), mistyped],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "did you mean" in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and time.perf_counter() - start < 15
