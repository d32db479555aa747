"""Build a FAISS index (flat or HNSW) over encoded passages.

`python scripts/build_index.py embeddings=outputs/train/dpr/embeddings index.type=hnsw`
"""

import hydra

from taser.cli import CONFIG_DIR, plain, setup_logging
from taser.pipeline.index import build_index
from taser.retrieval.faiss_index import IndexConfig


@hydra.main(config_path=CONFIG_DIR, config_name="build_index", version_base="1.3")
def main(cfg) -> None:
    setup_logging()
    c = plain(cfg)
    build_index(c["embeddings"], c["out_dir"], IndexConfig(**c["index"]))


if __name__ == "__main__":
    main()
