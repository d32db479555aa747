"""Shipped data and configs found from anywhere (taser.shipped): a config's `data/...` path read from
the package when the working directory lacks it, a user's own file at that path read first."""

from __future__ import annotations

import re
from pathlib import Path

from conftest import ROOT

from taser import shipped
from taser.shipped import shipped_file

SQUAD = "data/squad/squad-v1.1-dev-40-articles.json"


def test_a_missing_data_path_is_read_from_the_package(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    found = shipped_file(SQUAD)
    assert found == shipped.DATA_FILES / "squad" / "squad-v1.1-dev-40-articles.json" and found.is_file()
    assert shipped_file("./" + SQUAD) == found


def test_a_file_at_the_given_path_wins_and_other_paths_are_left_alone(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    own = tmp_path / SQUAD
    own.parent.mkdir(parents=True)
    own.write_text("{}")
    assert shipped_file(SQUAD) == Path(SQUAD)  # the user's own copy, relative as given
    assert shipped_file("data/squad/absent.json") == Path("data/squad/absent.json")  # not shipped: as given, for the reader's error
    assert shipped_file("outputs/data/squad/dev.json") == Path("outputs/data/squad/dev.json")
    assert shipped_file("squad/squad-v1.1-dev-40-articles.json") == Path("squad/squad-v1.1-dev-40-articles.json")  # only data/... is shipped data
    absolute = tmp_path / "elsewhere" / SQUAD
    assert shipped_file(absolute) == absolute


def test_every_data_path_the_configs_and_job_defaults_name_ships_in_the_package(tmp_path, monkeypatch):
    """A config naming shipped data that the package lacks would work in a clone and fail once installed."""
    # shipped data is what a `squad_json` names (DPR's files, under a table's data_dir as data/retriever/..., are downloaded)
    named = {m for p in (ROOT / "configs").rglob("*.yaml") for m in re.findall(r"squad_json: (\S+)", p.read_text(encoding="utf-8"))}
    named |= {m for p in (ROOT / "taser").rglob("*.py") for m in re.findall(r'squad_json: str = "([^"]+)"', p.read_text(encoding="utf-8"))}
    assert SQUAD in named
    monkeypatch.chdir(tmp_path)
    missing = sorted(n for n in named if not shipped_file(n).is_absolute())
    assert not missing, f"named under data/ but not shipped in the package (pyproject.toml's package data): {missing}"


def test_the_configs_are_found_through_the_package():
    assert Path(shipped.CONFIG_DIR) == shipped.PACKAGE / "configs"
    assert (Path(shipped.CONFIG_DIR) / "train.yaml").resolve() == (ROOT / "configs" / "train.yaml").resolve()


def test_the_commands_read_the_shipped_squad_data_from_any_directory(tmp_path, monkeypatch):
    """What reads shipped data goes through shipped_file: SQuAD's conversion, a table's data stage, the GPU check."""
    from hydra import compose, initialize_config_dir

    from taser.cli import typed
    from taser.data.squad import convert_squad
    from taser.gpu_check.data import prepare_data
    from taser.pipeline.rows import RowRun

    monkeypatch.chdir(tmp_path)
    assert convert_squad(SQUAD, tmp_path / "converted", train_articles=30)["passages"] == 2141
    (tmp_path / "check").mkdir()
    assert prepare_data(SQUAD, tmp_path / "check", passages=8, questions=4, articles=3).corpus_passages > 0
    with initialize_config_dir(config_dir=shipped.CONFIG_DIR, version_base="1.3"):
        cfg = compose("experiment", overrides=["table=squad_cpu", "row=bm25", f"stages_dir={tmp_path / 'stages'}", f"out_dir={tmp_path / 'run'}"])
    data = RowRun(typed(cfg)).data()
    assert Path(data["passages"]).is_file() and Path(data["qa_file"]).is_file()


def test_an_inspection_page_finds_the_shipped_data_a_run_names_outside_a_clone(tmp_path, monkeypatch):
    from taser.evaluation import inspect_texts

    monkeypatch.setattr(inspect_texts, "REPO_ROOT", tmp_path / "no-clone")  # an installed package: no checkout around it
    monkeypatch.chdir(tmp_path)
    found, _ = inspect_texts.locate(SQUAD)
    assert found is not None and found.resolve() == (shipped.DATA_FILES / "squad" / "squad-v1.1-dev-40-articles.json").resolve()
