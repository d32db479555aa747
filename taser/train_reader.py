"""Train DPR's extractive reader on a retrieval JSON of training questions.

taser-train-reader train_file=outputs/eval/train-bm25/retrieval.json output_dir=outputs/reader
Distributed: torchrun --nproc_per_node=8 -m taser.train_reader ... (train.batch_size is per process).
"""


import hydra

from taser.cli import CONFIG_DIR, run_dir, setup_logging, typed_or_exit
from taser.command_help import run_command
from taser.pipeline.reader import train_reader
from taser.reader.config import register_schemas

register_schemas()


@hydra.main(config_path=CONFIG_DIR, config_name="train_reader", version_base="1.3")
def main(cfg) -> None:
    setup_logging()
    result = train_reader(typed_or_exit(cfg), run_dir())
    print(f"trained the reader for {result.steps} steps: {result.final_dir}")


def command() -> None:
    """The console command (`taser-train-reader`): `--help` lists its settings; a mistyped one is answered before Hydra reads it."""
    run_command(main, "train_reader", __doc__)


if __name__ == "__main__":
    command()
