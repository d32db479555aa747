"""What ships inside the package: the Hydra configs and the SQuAD data the demo, the CPU tables and
the GPU check read. In a clone, `taser/configs` and `taser/data_files/*` are links to the top-level
`configs/` and `data/` (the one place they are edited); a wheel holds copies of them.

A config names shipped data by its path in a clone (`data/squad/...`, relative to the working
directory): run from anywhere else (an installed package, a clone run from another directory), a
missing `data/...` path falls back to the packaged copy of the same file. A file that exists at the
path always wins, so a user's own `data/squad/...` is read as given."""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
# the packaged configs (a wheel's copy, a link in a clone); a copy of the tree without links (a mutation run's) keeps the clone's
CONFIG_DIR = str(PACKAGE / "configs") if (PACKAGE / "configs").is_dir() else str(PACKAGE.parent / "configs")
DATA_FILES = PACKAGE / "data_files"
SHIPPED_PREFIX = "data/"  # how the configs name shipped data (relative to a clone's root)


def shipped_file(path: str | os.PathLike) -> Path:
    """`path` as given when it exists (or is absolute, or names no shipped file); else, for a
    relative `data/<name>`, the packaged copy of `<name>` when the package holds one."""
    given = Path(path)
    if given.is_absolute() or given.exists():
        return given
    text = given.as_posix()  # a Path drops a leading "./"
    if not text.startswith(SHIPPED_PREFIX):
        return given
    packaged = DATA_FILES / text.removeprefix(SHIPPED_PREFIX)
    return packaged if packaged.exists() else given
