"""`make demo`: the whole chain on the shipped SQuAD data and model; writes outputs/demo/results.md."""


import hydra

from taser.cli import CONFIG_DIR, setup_logging, typed_or_exit
from taser.command_help import run_command
from taser.pipeline.demo import run_demo


@hydra.main(config_path=CONFIG_DIR, config_name="demo", version_base="1.3")
def main(cfg) -> None:
    setup_logging()
    print(run_demo(typed_or_exit(cfg)))


def command() -> None:
    """The console command (`taser-demo`): `--help` lists its settings; a mistyped one is answered before Hydra reads it."""
    run_command(main, "demo", __doc__)


if __name__ == "__main__":
    command()
