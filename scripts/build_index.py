"""Build a FAISS index (flat or HNSW) over encoded passages.

`python scripts/build_index.py embeddings=outputs/train/dpr/embeddings index.type=hnsw`
"""

import _environment  # noqa: F401  (first: a Python without taser's environment is told how to get it)
import hydra

from taser.cli import CONFIG_DIR, setup_logging, typed
from taser.pipeline.index import build_index


@hydra.main(config_path=CONFIG_DIR, config_name="build_index", version_base="1.3")
def main(cfg) -> None:
    setup_logging()
    job = typed(cfg)
    build_index(job.embeddings, job.out_dir, job.index)


if __name__ == "__main__":
    main()
