"""Issue 47's first hour, as a new user lives it: after `make test`, the README's next step
(`source .venv/bin/activate`), then five documented commands copied verbatim from five pages, run
in a shell whose only Python is the one activation gives (no PYTHONPATH, no inherited virtual
environment), in a fresh directory holding only what a clone holds."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import ROOT

pytestmark = pytest.mark.slow

ACTIVATE = "source .venv/bin/activate"
# (page, command as the page gives it, what its success leaves behind or prints)
STEPS = [
    ("README.md", "python scripts/train.py --help", "model: dpr, shared, taser"),
    ("docs/training.md", "python scripts/prepare_squad.py out_dir=outputs/data/squad", "outputs/data/squad/dev.qa.tsv"),
    ("docs/tables.md", "python scripts/download.py table=squad_cpu", None),
    ("docs/comparing.md", "python scripts/evaluate.py retriever=bm25 name=BM25 out_dir=outputs/eval/squad/bm25", "outputs/eval/squad/bm25/results.json"),
    ("docs/gpu.md", "python scripts/gpu_check.py scale=dry_run", "outputs/gpu_check_dry_run/results.md"),
]


def test_the_steps_are_on_their_pages_verbatim():
    assert ACTIVATE in (ROOT / "README.md").read_text(encoding="utf-8")
    for page, command, _ in STEPS:
        assert command in (ROOT / page).read_text(encoding="utf-8"), f"{page} no longer gives `{command}`: update this test's steps"
    assert len({page for page, _, _ in STEPS}) == 5


def clone(where: Path) -> Path:
    """What a clone holds that the commands read (links: nothing is copied), and the `.venv` that
    `make test` built."""
    where.mkdir()
    for name in ("scripts", "configs", "data", "taser", "hydra_plugins", "pyproject.toml", ".venv"):
        (where / name).symlink_to(ROOT / name)
    return where


@pytest.mark.rehearsal
@pytest.mark.skipif(not (ROOT / ".venv" / "bin" / "activate").exists(), reason="no .venv here: `make test` builds it")
def test_make_test_then_the_readme_step_then_five_pages(tmp_path):
    root = clone(tmp_path / "taser")
    bash = shutil.which("bash")
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.update({k: v for k, v in os.environ.items() if k in ("JAVA_HOME", "TMPDIR")})
    for page, command, expected in STEPS:
        done = subprocess.run([bash, "-c", f"{ACTIVATE} && {command}"], cwd=root, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"{page}: `{command}` failed after `{ACTIVATE}`:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
        if expected and expected.startswith("outputs/"):
            assert (root / expected).is_file(), f"{page}: `{command}` left no {expected}"
        elif expected:
            assert expected in done.stdout, f"{page}: `{command}` printed no {expected!r}"
