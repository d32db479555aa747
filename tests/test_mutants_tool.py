"""`make mutants` (tools/mutants.py): which tests it runs, how it configures mutmut, and the score
it records. mutmut itself runs for minutes, so it is not run here."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from conftest import ROOT


def tool():
    spec = importlib.util.spec_from_file_location("mutants_tool", ROOT / "tools" / "mutants.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_tests_run_are_those_that_import_the_module():
    mutants = tool()
    reaching = mutants.tests_reaching(Path("taser/retrieval/index_memory.py"))
    assert "tests/test_index.py" in reaching  # `from taser.retrieval.index_memory import ...`
    assert "tests/test_stage_locks.py" not in reaching
    assert "tests/test_download.py" in mutants.tests_reaching(Path("taser/pipeline/download.py"))
    # `from taser.models import calibration_texts`: the package's import names the module
    assert "tests/test_onnx_backend.py" in mutants.tests_reaching(Path("taser/models/calibration_texts.py"))


def test_mutmut_mutates_only_the_module_and_runs_in_a_forkserver():
    cfg = tool().setup_cfg(Path("taser/pipeline/stages.py"), ["tests/test_stage_keys.py", "tests/test_stage_locks.py"])
    assert "only_mutate=taser/pipeline/stages.py" in cfg and "process_isolation=forkserver" in cfg
    selection = cfg.split("pytest_add_cli_args_test_selection=")[1].split()
    assert selection == ["tests/test_stage_keys.py", "tests/test_stage_locks.py"]


def test_the_score_counts_justified_equivalents_and_replaces_the_modules_line(tmp_path, monkeypatch):
    mutants = tool()
    monkeypatch.setattr(mutants, "RESULTS", tmp_path / "results.md")
    stats = {"total": 100, "skipped": 0, "killed": 80, "timeout": 5, "survived": 15, "no_tests": 0}
    line = mutants.record(Path("taser/x.py"), stats, equivalent=5, tests=["tests/a.py"])
    assert line.startswith("taser/x.py: 90.0%")
    mutants.record(Path("taser/y.py"), {**stats, "killed": 50, "survived": 45}, equivalent=0, tests=["tests/b.py"])
    mutants.record(Path("taser/x.py"), {**stats, "killed": 85, "survived": 10}, equivalent=0, tests=["tests/a.py"])
    rows = [r for r in (tmp_path / "results.md").read_text().splitlines() if r.startswith("| `taser/")]
    assert [r.split("|")[1].strip() for r in rows] == ["`taser/y.py`", "`taser/x.py`"]  # one line a module, the latest run's
    assert "| 90.0% |" in rows[1] and "| 55.0% |" in rows[0]


def test_a_process_a_test_starts_imports_the_package_the_test_imports(tmp_path):
    """Under `make mutants` the tests import the mutated copy; a script a test runs in a child must
    too, or every test that runs a script passes whatever the mutant (conftest's PYTHONPATH)."""
    import os
    import subprocess
    import sys

    import taser

    assert os.environ["PYTHONPATH"].split(os.pathsep)[0] == str(Path(taser.__file__).resolve().parents[1])
    child = subprocess.run([sys.executable, "-c", "import taser; print(taser.__file__)"], capture_output=True, text=True, check=True, cwd=tmp_path)
    assert Path(child.stdout.strip()).resolve() == Path(taser.__file__).resolve()
