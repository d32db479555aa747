"""Fetch DPR's and TASER's data and checkpoints (resumed, checksum-verified) into data_dir; see configs/download.yaml.

data_dir defaults to data/downloads (taser.pipeline.table.DATA_ROOT): where the tables (table.data.data_dir) and
data=nq, trivia and multiset (data.data_dir: <data_dir>/data, DPR's `data` directory) look, unless DPR_DATA_DIR says
otherwise. Fetched anywhere else, the script says what points data=nq at the files."""

import os
import sys
from pathlib import Path

import hydra

from taser.cli import CONFIG_DIR, setup_logging, typed_or_exit
from taser.command_help import run_command


def data_configs_hint(data_dir: str, names: list[str]) -> str | None:
    """For DPR's data fetched outside where data=nq (trivia, multiset) looks (configs/data/nq.yaml: $DPR_DATA_DIR,
    else <DATA_ROOT>/data), the line that points it there; None when it already looks there."""
    from taser.pipeline.table import DATA_ROOT

    if not any(name.startswith("data.") for name in names):
        return None
    fetched = Path(data_dir, "data")
    looked = Path(os.environ.get("DPR_DATA_DIR", str(Path(DATA_ROOT, "data"))))
    if looked.resolve() == fetched.resolve():
        return None
    return f"data=nq (trivia, multiset) reads {looked}; for the files fetched here: export DPR_DATA_DIR={fetched}"


@hydra.main(config_path=CONFIG_DIR, config_name="download", version_base="1.3")
def main(cfg) -> None:
    setup_logging()
    job = typed_or_exit(cfg)
    from taser.data.resources import RESOURCES
    from taser.pipeline.download import fetch

    if job.list_resources:
        for name, res in RESOURCES.items():
            print(f"{name}\t{res.path(job.data_dir)}\t{res.desc}")
        return
    names = job.names()
    if not names:
        print(f"table {job.table['name']} names no resources to fetch (its data ships with the project)")
    for name in names:
        print(fetch(name, job.data_dir, job.progress))
    hint = data_configs_hint(job.data_dir, names)
    if hint:
        print(hint, file=sys.stderr)


def command() -> None:
    """The console command (`taser-download`): `--help` lists its settings; a mistyped one is answered before Hydra reads it."""
    run_command(main, "download", __doc__)


if __name__ == "__main__":
    command()
