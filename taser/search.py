"""Rank a corpus for your own queries (no answers needed): writes run.trec and rankings.jsonl in out_dir.

`taser-search corpus=my-corpus.jsonl queries=my-queries.tsv checkpoint=facebook/dpr-question_encoder-single-nq-base`
`taser-search corpus=beir/scifact queries=beir/scifact/queries.jsonl checkpoint=outputs/train/taser/final k=10`
`taser-search corpus=my-corpus.tsv queries=my-queries.jsonl retriever=hybrid checkpoint=outputs/train/dpr/final`

A wrong input (a missing file, a directory that is not a checkpoint, a released model the hub cannot give offline, a
malformed line) is one line on stderr and exit status 2, before any model loads.
"""

import logging
import sys

import hydra

from taser.cli import CONFIG_DIR, setup_logging, typed_or_exit
from taser.command_help import run_command

log = logging.getLogger("taser.search")


@hydra.main(config_path=CONFIG_DIR, config_name="search", version_base="1.3")
def main(cfg) -> None:
    setup_logging()
    job = typed_or_exit(cfg)
    from taser.data.errors import DataFormatError
    from taser.data.queries import read_queries
    from taser.pipeline.released import CheckpointUnavailable
    from taser.pipeline.search import Searcher

    try:
        queries = read_queries(job.queries)
        searcher = Searcher(job.corpus, job.checkpoint, str(job.retriever), job.work_dir, job.bm25, job.dense_weight, job.batch_size,
                            str(job.precision), job.device, job.allow_pickle)
    except (FileNotFoundError, DataFormatError, CheckpointUnavailable) as e:
        print(f"taser-search: {e}", file=sys.stderr)
        sys.exit(2)
    log.info("ranking %d queries against %s (%s)", len(queries), searcher.passages, job.retriever)
    files = searcher.write(searcher.search(queries, job.k), job.out_dir, queries, job.tag)
    print(f"{len(queries)} queries ranked: {files['trec']} (TREC run), {files['jsonl']} (with the passages' texts)")


def command() -> None:
    """The console command (`taser-search`): `--help` lists its settings; a mistyped one is answered before Hydra reads it."""
    run_command(main, "search", __doc__)


if __name__ == "__main__":
    command()
