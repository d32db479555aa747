"""`make demo`: the whole chain on the shipped SQuAD data and model; writes outputs/demo/results.md."""

import sys

import hydra

from taser.cli import CONFIG_DIR, setup_logging, typed
from taser.command_help import print_help_if_asked
from taser.override_check import check_overrides
from taser.pipeline.demo import run_demo


@hydra.main(config_path=CONFIG_DIR, config_name="demo", version_base="1.3")
def main(cfg) -> None:
    setup_logging()
    print(run_demo(typed(cfg)))


def command() -> None:
    """The console command (`taser-demo`): `--help` lists its settings; a mistyped one is answered before Hydra reads it."""
    print_help_if_asked(CONFIG_DIR, "demo", "taser-demo", __doc__, sys.argv[1:])
    check_overrides(CONFIG_DIR, "demo")
    main()


if __name__ == "__main__":
    command()
