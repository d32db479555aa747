"""Each command's `--help`: what it does, then every setting with its value and its meaning (from the
typed schema's comments), the groups that can be chosen; Hydra's own help at `--hydra-help`."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT
from test_documented_commands import command_modules, hydra_scripts

from taser.command_help import field_comments, help_text
from taser.override_check import _schema_of
from taser.shipped import CONFIG_DIR


@pytest.mark.parametrize("script", sorted(hydra_scripts()))
def test_every_main_setting_of_every_command_is_listed_with_a_meaning(script):
    config = hydra_scripts()[script]
    schema = _schema_of(Path(CONFIG_DIR), config)
    text = help_text(CONFIG_DIR, config, "taser-" + script.replace("_", "-"), None)
    meanings = field_comments(schema)
    for field in dataclasses.fields(schema):
        assert meanings.get(field.name), f"{schema.__name__}.{field.name} has no comment: --help shows it without a meaning"
        lines = [line for line in text.splitlines() if line.startswith((f"  {field.name}=", f"  {field.name}.*:"))]
        assert len(lines) == 1 and meanings[field.name][:40] in lines[0], (field.name, lines)


def test_help_shows_the_values_the_command_line_would_give():
    text = help_text(CONFIG_DIR, "train", "taser-train", None, ["model=taser", "train.batch_size=4"])
    assert "  train.batch_size=4 " in text and "  model.model_type=taser" in text and "  model: dpr, shared, taser" in text


def test_the_help_flag_prints_it_and_exits_0_without_hydras_dump():
    start = time.perf_counter()
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "search.py"), "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("taser-search: Rank a corpus") and "corpus=???" in done.stdout
    assert "== Configuration groups ==" not in done.stdout and time.perf_counter() - start < 20
    assert set(command_modules()) >= set(hydra_scripts())
