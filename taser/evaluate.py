"""Retrieve and evaluate: top-1/5/20/100 accuracy on a QA file (task=qa, the default), BEIR's
nDCG@10 / Recall@100 / MRR@10 on a BEIR dataset directory (task=beir), or top-k accuracy per
relation and its macro average on EntityQuestions (task=entity_questions).

`taser-evaluate checkpoint=outputs/train/dpr/final index=outputs/train/dpr/index [search.ef_search=512]`
`taser-evaluate retriever=bm25 bm25.backend=pyserini`
`taser-evaluate retriever=hybrid checkpoint=... index=... hybrid.dense_weight=1.1`
`taser-evaluate task=beir beir.dir=beir/scifact checkpoint=... out_dir=outputs/eval/scifact/dense`
`taser-evaluate task=entity_questions entity_questions.dir=EntityQuestions/dataset/test data=nq retriever=bm25`
`taser-evaluate data=nq_hub retriever=bm25` (a hub question set over a hub corpus, through `datasets`)
`taser-evaluate task=beir beir.hub=BeIR/scifact retriever=bm25`
"""


import hydra

from taser.cli import CONFIG_DIR, DATA_HINT, checkpoint_or_exit, inputs_or_exit, setup_logging, typed_or_exit
from taser.command_help import run_command
from taser.data.config import DataSource
from taser.pipeline.evaluate_task import run_evaluation
from taser.pipeline.jobs import EvalTask


@hydra.main(config_path=CONFIG_DIR, config_name="evaluate", version_base="1.3")
def main(cfg) -> None:
    setup_logging()
    job = typed_or_exit(cfg)
    local = job.data.source == DataSource.local
    inputs_or_exit({"qa_file": job.qa_file if local and job.task == EvalTask.qa else None,
                    "passages": job.passages if local and job.task != EvalTask.beir else None}, hint=DATA_HINT)
    inputs_or_exit({}, {"index": job.index, "beir.dir": job.beir.dir if job.task == EvalTask.beir else None,
                        "entity_questions.dir": job.entity_questions.dir if job.task == EvalTask.entity_questions else None})
    if job.checkpoint:
        job.checkpoint = checkpoint_or_exit(job.checkpoint)
    results = run_evaluation(job)
    print(results["summary"])


def command() -> None:
    """The console command (`taser-evaluate`): `--help` lists its settings; a mistyped one is answered before Hydra reads it."""
    run_command(main, "evaluate", __doc__)


if __name__ == "__main__":
    command()
