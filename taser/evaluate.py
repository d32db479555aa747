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

from taser.cli import CONFIG_DIR, checkpoint_or_exit, setup_logging, typed
from taser.command_help import run_command
from taser.pipeline.evaluate_task import run_evaluation


@hydra.main(config_path=CONFIG_DIR, config_name="evaluate", version_base="1.3")
def main(cfg) -> None:
    setup_logging()
    job = typed(cfg)
    if job.checkpoint:
        job.checkpoint = checkpoint_or_exit(job.checkpoint)
    results = run_evaluation(job)
    print(results["summary"])


def command() -> None:
    """The console command (`taser-evaluate`): `--help` lists its settings; a mistyped one is answered before Hydra reads it."""
    run_command(main, "evaluate", __doc__)


if __name__ == "__main__":
    command()
