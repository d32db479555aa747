"""Answer the questions of a retrieval JSON with a trained reader: predictions.json and
results.json (EM / F1 at each k passages read) in out_dir.

taser-read checkpoint=outputs/reader/final retrieval=outputs/eval/bm25/retrieval.json out_dir=outputs/read/bm25 ks=[1,5,20]
"""

import sys

import hydra

from taser.cli import CONFIG_DIR, setup_logging, typed
from taser.command_help import print_help_if_asked
from taser.override_check import check_overrides
from taser.pipeline.reader import format_scores, read
from taser.reader.config import register_schemas

register_schemas()


@hydra.main(config_path=CONFIG_DIR, config_name="read", version_base="1.3")
def main(cfg) -> None:
    setup_logging()
    results = read(typed(cfg))
    print(f"{results['questions']} questions: {format_scores(results)}")


def command() -> None:
    """The console command (`taser-read`): `--help` lists its settings; a mistyped one is answered before Hydra reads it."""
    print_help_if_asked(CONFIG_DIR, "read", "taser-read", __doc__, sys.argv[1:])
    check_overrides(CONFIG_DIR, "read")
    main()


if __name__ == "__main__":
    command()
