"""Build a FAISS index (flat or HNSW) over encoded passages.

`taser-build-index embeddings=outputs/train/dpr/embeddings index.type=hnsw`
"""


import hydra

from taser.cli import CONFIG_DIR, setup_logging, typed_or_exit
from taser.command_help import run_command
from taser.pipeline.index import build_index


@hydra.main(config_path=CONFIG_DIR, config_name="build_index", version_base="1.3")
def main(cfg) -> None:
    setup_logging()
    job = typed_or_exit(cfg)
    build_index(job.embeddings, job.out_dir, job.index)


def command() -> None:
    """The console command (`taser-build-index`): `--help` lists its settings; a mistyped one is answered before Hydra reads it."""
    run_command(main, "build_index", __doc__)


if __name__ == "__main__":
    command()
