"""One default data root (issue 47): `scripts/download.py` fetches into `taser.pipeline.table.DATA_ROOT`
(data/downloads), and everything that reads DPR's files looks there by default -- the tables
(`table.data.data_dir`), `data=nq`, `data=trivia` and `data=multiset` (`data.data_dir`: DPR's `data`
directory under the root, or `$DPR_DATA_DIR`), the recipes and the docs. A plain download followed by
`data=nq` finds the files where the download put them (on a loopback server, no network)."""

from __future__ import annotations

import dataclasses
import gzip
import re
import runpy
import sys
from pathlib import Path

import pytest
from conftest import ROOT
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf
from test_download import server  # noqa: F401 (the loopback server fixture)

from taser.cli import CONFIG_DIR, typed
from taser.data.resources import RESOURCES
from taser.pipeline.jobs import DownloadJob
from taser.pipeline.table import DATA_ROOT, DataSpec

DPR_DATA = f"{DATA_ROOT}/data"  # DPR's `data` directory under the root: what configs/data/*.yaml call data_dir
DPR_LAYOUT = ("nq", "trivia", "multiset")  # the data configs that read DPR's downloaded files
NQ = ["data.retriever.nq-train", "data.retriever.nq-dev", "data.wikipedia_split.psgs_w100", "data.retriever.qas.nq-test"]
DOCS = ["docs/evaluation.md", "docs/encoding.md", "docs/checkpoints.md", "docs/data.md"]
OLD_ROOT = re.compile(r"(?<![\w/.-])downloads/data\b")  # DPR's own root used as ours (data/downloads/data and .../DPR/downloads/data are fine)
ENV_DEFAULT = re.compile(r"(?:oc\.env:DPR_DATA_DIR,|\$\{DPR_DATA_DIR:-)([^}]+)\}")  # ${oc.env:DPR_DATA_DIR,X} and ${DPR_DATA_DIR:-X}


def composed(name: str, *overrides: str):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return compose(config_name=name, overrides=list(overrides))


def data_config(name: str):
    """data=<name> as train.py composes it, typed (DataConfig)."""
    return typed(composed("train", f"data={name}")).data


def data_files(data) -> list[str]:
    return [*data.train_files, data.dev_file, data.passages, data.qa_file]


def resource_paths(root: str) -> set[Path]:
    return {res.path(root) for res in RESOURCES.values()}


def test_every_default_data_root_agrees(monkeypatch):
    monkeypatch.delenv("DPR_DATA_DIR", raising=False)
    assert DATA_ROOT == "data/downloads"  # what the docs say
    assert DownloadJob(resource="data.retriever.nq-train").data_dir == DATA_ROOT
    assert DataSpec(kind="files", train_files=["t"], qa_file="q", passages="p").data_dir == DATA_ROOT
    assert typed(composed("download", "resource=data.retriever.nq-train")).data_dir == DATA_ROOT  # configs/download.yaml keeps it
    for name in DPR_LAYOUT:
        data = data_config(name)
        assert data.data_dir == DPR_DATA, f"configs/data/{name}.yaml: data_dir {data.data_dir}, not {DPR_DATA}"
        missing = [f for f in data_files(data) if Path(f) not in resource_paths(DATA_ROOT)]
        assert not missing, f"data={name} reads files scripts/download.py does not put there: {missing}"
    tables = sorted((ROOT / "configs" / "table").glob("*.yaml"))
    assert tables
    for path in tables:
        spec = OmegaConf.load(path).table.data
        if spec.get("kind") != "files":
            continue
        assert spec.get("data_dir", DATA_ROOT) == DATA_ROOT, f"{path.name}: table.data.data_dir {spec.data_dir}, not {DATA_ROOT}"
        rows = OmegaConf.load(path).table.get("rows", {})
        names = [*spec.train_files, spec.qa_file, spec.passages, *(f for row in rows.values() for f in row.get("train_files") or [])]
        missing = [f for f in names if Path(DATA_ROOT, f) not in resource_paths(DATA_ROOT)]
        assert not missing, f"{path.name} reads files scripts/download.py does not put there: {missing}"


def test_no_file_names_another_data_root():
    """DPR's own `downloads/data` is named only as DPR's (a line about DPR's tree or its download_data.py), never as
    this library's default; every `DPR_DATA_DIR` fallback is the root's `data` directory."""
    texts = [p for d in ("configs", "scripts", "taser") for p in (ROOT / d).rglob("*") if p.suffix in (".yaml", ".py")]
    texts += [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]
    wrong = []
    for path in texts:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            where = f"{path.relative_to(ROOT)}:{number}"
            if OLD_ROOT.search(line) and not ("download_data" in line or "DPR's" in line):  # a line about DPR's own tree
                wrong.append(f"{where}: {line.strip()}")
            wrong += [f"{where}: DPR_DATA_DIR falls back to {m.group(1)}" for m in ENV_DEFAULT.finditer(line) if m.group(1) != DPR_DATA]
    assert not wrong, "another default data root than " + DATA_ROOT + ":\n" + "\n".join(wrong)
    for doc in DOCS:  # the docs that name the root say the same: ours, and where DPR's downloader puts the files
        text = (ROOT / doc).read_text(encoding="utf-8")
        assert "data/downloads" in text and "DPR_DATA_DIR" in text and "download_data.py" in text and "downloads/data" in text, doc


@pytest.fixture
def served(server, monkeypatch):  # noqa: F811 (the fixture imported above)
    """DPR's NQ resources, tiny, on the loopback: RESOURCES point there for the test."""
    base, handler = server
    bodies = {}
    for name in NQ:
        res = RESOURCES[name]
        bodies[name] = body = f"{name}\tthe file of {name}\n".encode()
        handler.files[f"/{res.download_name}"] = gzip.compress(body) if res.gzip else body
        monkeypatch.setitem(RESOURCES, name, dataclasses.replace(res, url=f"{base}/{res.download_name}"))
    return bodies


def run_download(monkeypatch, capsys, *overrides: str) -> tuple[list[Path], str]:
    """`python scripts/download.py <overrides>` in this process (Hydra's own command-line run, in the current
    directory): the paths it printed, and its stderr."""
    import logging

    import taser.cli

    monkeypatch.setattr(taser.cli, "setup_logging", lambda *a, **k: None)  # leave pytest's log handlers alone
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    monkeypatch.setattr(sys, "argv", ["download.py", *overrides, "hydra/job_logging=none", "hydra/hydra_logging=none"])
    capsys.readouterr()
    try:
        runpy.run_path(str(ROOT / "scripts" / "download.py"), run_name="__main__")
    finally:
        GlobalHydra.instance().clear()
        root.handlers[:], root.level = handlers, level
    out = capsys.readouterr()
    return [Path(line).resolve() for line in out.out.splitlines() if line.strip()], out.err


def test_a_download_then_data_nq_finds_the_files_where_the_download_put_them(served, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("DPR_DATA_DIR", raising=False)
    monkeypatch.chdir(tmp_path)  # a fresh checkout: both relative defaults resolve from here
    fetched, err = run_download(monkeypatch, capsys, f"resource=[{','.join(NQ)}]", "progress=false")
    assert fetched == [(tmp_path / RESOURCES[name].path(DATA_ROOT)) for name in NQ]
    assert [p.read_bytes() for p in fetched] == [served[name] for name in NQ]
    assert "DPR_DATA_DIR" not in err  # fetched where data=nq looks: nothing to point
    assert [Path(f).resolve() for f in data_files(data_config("nq"))] == fetched  # train, dev, passages, questions

    # fetched elsewhere: the script names the DPR_DATA_DIR that points data=nq there, and with it data=nq finds them
    fetched, err = run_download(monkeypatch, capsys, f"resource=[{','.join(NQ)}]", "progress=false", "data_dir=elsewhere")
    assert all(p.is_relative_to(tmp_path / "elsewhere" / "data") for p in fetched)
    hint = re.search(r"export DPR_DATA_DIR=(\S+)", err)
    assert hint and Path(hint.group(1)) == Path("elsewhere", "data"), err
    monkeypatch.setenv("DPR_DATA_DIR", hint.group(1))
    assert [Path(f).resolve() for f in data_files(data_config("nq"))] == fetched
