"""Retrieve and evaluate: top-1/5/20/100 accuracy on a QA file (task=qa, the default), BEIR's
nDCG@10 / Recall@100 / MRR@10 on a BEIR dataset directory (task=beir), or top-k accuracy per
relation and its macro average on EntityQuestions (task=entity_questions).

`python scripts/evaluate.py checkpoint=outputs/train/dpr/final index=outputs/train/dpr/index [search.ef_search=512]`
`python scripts/evaluate.py retriever=bm25 bm25.backend=pyserini`
`python scripts/evaluate.py retriever=hybrid checkpoint=... index=... hybrid.dense_weight=1.1`
`python scripts/evaluate.py task=beir beir.dir=beir/scifact checkpoint=... out_dir=outputs/eval/scifact/dense`
`python scripts/evaluate.py task=entity_questions entity_questions.dir=EntityQuestions/dataset/test data=nq retriever=bm25`
"""

import hydra

from taser.cli import CONFIG_DIR, setup_logging, typed
from taser.pipeline.evaluate import evaluate_qa
from taser.pipeline.evaluate_ood import evaluate_beir, evaluate_entity_questions


@hydra.main(config_path=CONFIG_DIR, config_name="evaluate", version_base="1.3")
def main(cfg) -> None:
    setup_logging()
    job = typed(cfg)
    settings = job.retriever_settings()
    if job.task == "beir":
        b = job.beir
        results = evaluate_beir(settings, b.dir, job.out_dir, b.split, job.k, b.ignore_identical_ids, b.work_dir, job.dataset, job.name)
    elif job.task == "entity_questions":
        e = job.entity_questions
        results = evaluate_entity_questions(settings, e.dir, job.passages, job.out_dir, e.split, job.k, job.match, e.write_json, job.name)
    else:
        results = evaluate_qa(settings, job.qa_file, job.passages, job.out_dir, job.k, job.match, job.dataset, job.name)
    print(results["summary"])


if __name__ == "__main__":
    main()
