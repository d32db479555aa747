"""Convert SQuAD JSON into DPR's formats (passages TSV, QA TSVs, bi-encoder JSON), split by article.

`taser-prepare-squad out_dir=outputs/data/squad`
"""

import json

import hydra

from taser.cli import CONFIG_DIR, setup_logging, typed_or_exit
from taser.command_help import run_command
from taser.data.squad import convert_squad


@hydra.main(config_path=CONFIG_DIR, config_name="prepare_squad", version_base="1.3")
def main(cfg) -> None:
    setup_logging()
    job = typed_or_exit(cfg)
    summary = convert_squad(job.squad_json, job.out_dir, job.train_articles, job.words_per_passage, job.random_negatives, job.seed)
    print(json.dumps(summary, indent=2))


def command() -> None:
    """The console command (`taser-prepare-squad`): `--help` lists its settings; a mistyped one is answered before Hydra reads it."""
    run_command(main, "prepare_squad", __doc__)


if __name__ == "__main__":
    command()
