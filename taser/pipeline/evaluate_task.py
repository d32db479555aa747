"""What `scripts/evaluate.py` runs: the job's task (QA, BEIR, EntityQuestions) on its data, from
files or from the hub (`data.source=hub`, `beir.hub`)."""

from __future__ import annotations

from taser.pipeline.evaluate import evaluate_qa, evaluate_qa_hub
from taser.pipeline.evaluate_ood import BeirHub, evaluate_beir, evaluate_entity_questions


def run_evaluation(job) -> dict:
    """`job`: a `taser.pipeline.jobs.EvaluateJob`. Returns the task's results (`summary` among them)."""
    settings = job.retriever_settings()
    hub = job.data.hub if job.data.source == "hub" else None
    if job.task == "beir":
        b = job.beir
        source = BeirHub(b.hub, job.data.hub.cache_dir) if b.hub else b.dir
        return evaluate_beir(settings, source, job.out_dir, b.split, job.k, b.ignore_identical_ids, b.work_dir, job.dataset, job.name)
    if job.task == "entity_questions":
        e = job.entity_questions
        passages = job.passages
        if hub:
            from taser.data.hub_qa import hub_passages_tsv

            passages = hub_passages_tsv(hub.passages, hub.work_dir, hub.id_column, hub.cache_dir)
        return evaluate_entity_questions(settings, e.dir, passages, job.out_dir, e.split, job.k, job.match, e.write_json, job.name)
    if hub:
        return evaluate_qa_hub(settings, hub, job.out_dir, job.k, job.match, job.dataset, job.name)
    return evaluate_qa(settings, job.qa_file, job.passages, job.out_dir, job.k, job.match, job.dataset, job.name)
