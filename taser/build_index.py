"""Build a FAISS index (flat or HNSW) over encoded passages.

`taser-build-index embeddings=outputs/train/dpr/embeddings index.type=hnsw`
"""

import sys

import hydra

from taser.cli import CONFIG_DIR, setup_logging, typed
from taser.command_help import print_help_if_asked
from taser.override_check import check_overrides
from taser.pipeline.index import build_index


@hydra.main(config_path=CONFIG_DIR, config_name="build_index", version_base="1.3")
def main(cfg) -> None:
    setup_logging()
    job = typed(cfg)
    build_index(job.embeddings, job.out_dir, job.index)


def command() -> None:
    """The console command (`taser-build-index`): `--help` lists its settings; a mistyped one is answered before Hydra reads it."""
    print_help_if_asked(CONFIG_DIR, "build_index", "taser-build-index", __doc__, sys.argv[1:])
    check_overrides(CONFIG_DIR, "build_index")
    main()


if __name__ == "__main__":
    command()
