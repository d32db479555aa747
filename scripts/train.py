"""Train a bi-encoder. `python scripts/train.py model=taser data=squad train.max_steps=100`

Distributed: `torchrun --nproc_per_node=8 scripts/train.py ...` (train.batch_size is per process).
"""

import hydra

from taser.cli import CONFIG_DIR, plain, run_dir, setup_logging
from taser.pipeline.train import run_training


@hydra.main(config_path=CONFIG_DIR, config_name="train", version_base="1.3")
def main(cfg) -> None:
    setup_logging()
    c = plain(cfg)
    run_training(c["model"], c["data"]["train_files"], c["train"], run_dir(), dev_file=c["data"].get("dev_file"))


if __name__ == "__main__":
    main()
