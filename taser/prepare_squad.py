"""Convert SQuAD JSON into DPR's formats (passages TSV, QA TSVs, bi-encoder JSON), split by article.

`taser-prepare-squad out_dir=outputs/data/squad`
"""

import json
import sys

import hydra

from taser.cli import CONFIG_DIR, setup_logging, typed
from taser.command_help import print_help_if_asked
from taser.data.squad import convert_squad
from taser.override_check import check_overrides


@hydra.main(config_path=CONFIG_DIR, config_name="prepare_squad", version_base="1.3")
def main(cfg) -> None:
    setup_logging()
    job = typed(cfg)
    summary = convert_squad(job.squad_json, job.out_dir, job.train_articles, job.words_per_passage, job.random_negatives, job.seed)
    print(json.dumps(summary, indent=2))


def command() -> None:
    """The console command (`taser-prepare-squad`): `--help` lists its settings; a mistyped one is answered before Hydra reads it."""
    print_help_if_asked(CONFIG_DIR, "prepare_squad", "taser-prepare-squad", __doc__, sys.argv[1:])
    check_overrides(CONFIG_DIR, "prepare_squad")
    main()


if __name__ == "__main__":
    command()
