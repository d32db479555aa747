"""Train a bi-encoder. `taser-train model=taser data=squad train.max_steps=100`

Distributed: `torchrun --nproc_per_node=8 -m taser.train ...` (train.batch_size is per process).
"""


import hydra

from taser.cli import CONFIG_DIR, DATA_HINT, inputs_or_exit, pretrained_or_exit, run_dir, setup_logging, typed_or_exit
from taser.command_help import run_command
from taser.data.config import DataSource


@hydra.main(config_path=CONFIG_DIR, config_name="train", version_base="1.3")
def main(cfg) -> None:
    setup_logging()
    job = typed_or_exit(cfg)  # settings are checked before torch is imported: a mistake is reported in seconds
    if job.data.source == DataSource.local:
        inputs_or_exit({"data.train_files": job.data.train_files, "data.dev_file": job.data.dev_file}, hint=DATA_HINT)
    if job.model.pretrained:
        pretrained_or_exit(job.model.pretrained)
    from taser.pipeline.train import run_training

    run_training(job.model, job.data, job.train, run_dir())


def command() -> None:
    """The console command (`taser-train`): `--help` lists its settings; a mistyped one is answered before Hydra reads it."""
    run_command(main, "train", __doc__)


if __name__ == "__main__":
    command()
