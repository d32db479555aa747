"""Answer the questions of a retrieval JSON with a trained reader: predictions.json and
results.json (EM / F1 at each k passages read) in out_dir.

taser-read checkpoint=outputs/reader/final retrieval=outputs/eval/bm25/retrieval.json out_dir=outputs/read/bm25 ks=[1,5,20]
"""


import hydra

from taser.cli import CONFIG_DIR, setup_logging, typed_or_exit
from taser.command_help import run_command
from taser.pipeline.reader import format_scores, read
from taser.reader.config import register_schemas

register_schemas()


@hydra.main(config_path=CONFIG_DIR, config_name="read", version_base="1.3")
def main(cfg) -> None:
    setup_logging()
    results = read(typed_or_exit(cfg))
    print(f"{results['questions']} questions: {format_scores(results)}")


def command() -> None:
    """The console command (`taser-read`): `--help` lists its settings; a mistyped one is answered before Hydra reads it."""
    run_command(main, "read", __doc__)


if __name__ == "__main__":
    command()
