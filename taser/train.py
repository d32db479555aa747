"""Train a bi-encoder. `taser-train model=taser data=squad train.max_steps=100`

Distributed: `torchrun --nproc_per_node=8 -m taser.train ...` (train.batch_size is per process).
"""

import hydra

from taser.cli import CONFIG_DIR, run_dir, setup_logging, typed


@hydra.main(config_path=CONFIG_DIR, config_name="train", version_base="1.3")
def main(cfg) -> None:
    setup_logging()
    job = typed(cfg)  # settings are checked before torch is imported: a mistake is reported in seconds
    from taser.pipeline.train import run_training

    run_training(job.model, job.data, job.train, run_dir())


if __name__ == "__main__":
    main()
