"""Retrieve top-k passages for a QA file and report top-1/5/20/100 accuracy.

`python scripts/evaluate.py checkpoint=outputs/train/dpr/final index=outputs/train/dpr/index`
"""

import hydra

from taser.cli import CONFIG_DIR, plain, setup_logging
from taser.pipeline.evaluate import evaluate_dense


@hydra.main(config_path=CONFIG_DIR, config_name="evaluate", version_base="1.3")
def main(cfg) -> None:
    setup_logging()
    c = plain(cfg)
    if c["retriever"] != "dense":
        raise ValueError(f"retriever={c['retriever']!r} is not available; use retriever=dense")
    if not c["checkpoint"] or not c["index"]:
        raise ValueError("retriever=dense needs checkpoint=... and index=...")
    results = evaluate_dense(c["checkpoint"], c["index"], c["qa_file"], c["passages"], c["out_dir"], c["k"], c["match"], c["batch_size"], c["precision"], c["device"])
    print(results["summary"])


if __name__ == "__main__":
    main()
