"""Mine hard negatives (and distant-supervision positives) with BM25 or a dense model.

`taser-mine-negatives` (BM25 over the SQuAD benchmark's training questions)
`taser-mine-negatives retriever=dense checkpoint=outputs/train/dpr/final index=outputs/train/dpr/index`
`taser-mine-negatives distant_positives=true` (positives from BM25's best answer-bearing passage, DPR's Table 5)
"""

import json

import hydra

from taser.cli import CONFIG_DIR, inputs_or_exit, setup_logging, typed_or_exit
from taser.command_help import run_command
from taser.pipeline.mine import mine_negatives


@hydra.main(config_path=CONFIG_DIR, config_name="mine_negatives", version_base="1.3")
def main(cfg) -> None:
    setup_logging()
    job = typed_or_exit(cfg)
    inputs_or_exit({"input": job.input, "passages": job.passages})
    summary = mine_negatives(
        job.input, job.passages, job.output, retriever=job.retriever, top_n=job.top_n,
        num_hard_negatives=job.num_hard_negatives, match=job.match, bm25=job.bm25, checkpoint=job.checkpoint,
        index=job.index, batch_size=job.batch_size, precision=job.precision, backend=job.backend, device=job.device,
        block_size=job.block_size, offsets_cache=job.offsets_cache, progress=job.progress, distant_positives=job.distant_positives,
    )
    print(json.dumps(summary, indent=2))


def command() -> None:
    """The console command (`taser-mine-negatives`): `--help` lists its settings; a mistyped one is answered before Hydra reads it."""
    run_command(main, "mine_negatives", __doc__)


if __name__ == "__main__":
    command()
