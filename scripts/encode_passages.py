"""Encode a passages TSV with a checkpoint's passage encoder, one shard per call.

`python scripts/encode_passages.py checkpoint=outputs/train/dpr/final shard_id=0 num_shards=50`
"""

import hydra

from taser.cli import CONFIG_DIR, plain, setup_logging
from taser.pipeline.encode import encode_corpus


@hydra.main(config_path=CONFIG_DIR, config_name="encode_passages", version_base="1.3")
def main(cfg) -> None:
    setup_logging()
    c = plain(cfg)
    encode_corpus(c["checkpoint"], c["passages"], c["out_dir"], c["shard_id"], c["num_shards"], c["batch_size"], c["precision"], c["chunk_size"], c["device"])


if __name__ == "__main__":
    main()
