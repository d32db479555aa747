"""Mine hard negatives (and distant-supervision positives) with BM25 or a dense model.

`python scripts/mine_negatives.py` (BM25 over the SQuAD benchmark's training questions)
`python scripts/mine_negatives.py retriever=dense checkpoint=outputs/train/dpr/final index=outputs/train/dpr/index`
"""

import json

import hydra

from taser.cli import CONFIG_DIR, plain, setup_logging
from taser.pipeline.mine import mine_negatives


@hydra.main(config_path=CONFIG_DIR, config_name="mine_negatives", version_base="1.3")
def main(cfg) -> None:
    setup_logging()
    c = plain(cfg)
    summary = mine_negatives(
        c["input"], c["passages"], c["output"], retriever=c["retriever"], top_n=c["top_n"],
        num_hard_negatives=c["num_hard_negatives"], match=c["match"], bm25=c["bm25"], checkpoint=c["checkpoint"],
        index=c["index"], batch_size=c["batch_size"], precision=c["precision"], device=c["device"],
        block_size=c["block_size"], offsets_cache=c["offsets_cache"], progress=c["progress"],
    )
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
