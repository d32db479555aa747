"""Stage: out-of-domain evaluation, as the TASER paper measures robustness.

- BEIR (Thakur et al. 2021): a dataset directory (`corpus.jsonl`, `queries.jsonl`,
  `qrels/<split>.tsv`); nDCG@10, Recall@100 and MRR@10 with BEIR's conventions
  (`taser.evaluation.ir_metrics`, computed by pytrec_eval), a TREC run file beside `results.json`.
- EntityQuestions (Sciavolino et al. 2021): one question file per Wikidata relation, retrieved
  from DPR's Wikipedia passages; top-k accuracy per relation and the macro average over
  relations (the paper's and TASER's figure).

Retrieval is `taser.pipeline.evaluate.retrieve` (dense, BM25 or hybrid), as for QA files.
Every input is read and checked before any model or index is loaded, and `results.json` is
written last: a failed run leaves no results file.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from taser.data.beir import beir_files, read_beir_split, write_beir_passages
from taser.data.entity_questions import DATASET as ENTITY_QUESTIONS
from taser.data.entity_questions import read_entity_questions
from taser.data.hub_beir import HubBeir, hub_beir_passages, load_beir_hub
from taser.data.passages import write_passages
from taser.data.trec import write_trec_run
from taser.evaluation.ir_metrics import drop_identical_ids, evaluate_qrels, per_query_metrics, success_curve
from taser.evaluation.per_query import PER_QUERY_FILE, beir_records, qa_records, write_per_query
from taser.evaluation.retrieval_eval import evaluate_retrieval, fetch_passages
from taser.evaluation.topk import CURVE_K, DEFAULT_KS, format_topk
from taser.io import atomic_open
from taser.pipeline.evaluate import RetrieverSettings, retrieve, with_bm25_dir, with_system

log = logging.getLogger(__name__)

BEIR_KS = (10, 100)  # nDCG@k and Recall@k kept in results.json; MRR at 10
BEIR_HEADLINE = ("nDCG@10", "Recall@100", "MRR@10")
RUN_FILE = "run.trec"


def _source_stamp(path: Path) -> dict:
    st = path.stat()
    return {"path": str(path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _converted_once(work_dir: str | os.PathLike, stamp: dict, what: str, convert) -> tuple[Path, dict]:
    """`work_dir/passages.tsv`, made by `convert(tsv) -> counts` unless `passages.json` records the
    same source `stamp` (then reused), with the conversion's counts."""
    work = Path(work_dir)
    tsv, stamp_file = work / "passages.tsv", work / "passages.json"
    if tsv.is_file() and stamp_file.is_file():
        recorded = json.loads(stamp_file.read_text())
        if recorded.get("source") == stamp:
            return tsv, recorded["counts"]
    log.info("converting %s into %s", what, tsv)
    counts = convert(tsv)
    if counts["title_as_text"] or counts["skipped_empty"]:
        log.warning("%s: %d document(s) without a text kept with their title as text, %d without either skipped",
                    what, counts["title_as_text"], counts["skipped_empty"])
    with atomic_open(stamp_file) as f:
        json.dump({"source": stamp, "counts": counts}, f, indent=2)
    return tsv, counts


def beir_passages_tsv(corpus: str | os.PathLike, work_dir: str | os.PathLike) -> tuple[Path, dict]:
    """`work_dir/passages.tsv`: the BEIR corpus as a passages TSV, converted once and reused while
    `corpus.jsonl` is unchanged (`passages.json` records its source and the conversion counts)."""
    return _converted_once(work_dir, _source_stamp(Path(corpus)), corpus, lambda tsv: write_beir_passages(corpus, tsv))


def beir_hub_passages_tsv(beir: HubBeir, work_dir: str | os.PathLike) -> tuple[Path, dict]:
    """`work_dir/passages.tsv`: a hub BEIR corpus as a passages TSV, converted once and reused while
    the dataset's fingerprint is unchanged."""
    spec = beir.corpus_spec
    stamp = {"dataset": spec.name, "config": spec.config, "split": spec.split, "fingerprint": beir.corpus._fingerprint}

    def convert(tsv: Path) -> dict:
        stats: dict = {}
        write_passages(tsv, hub_beir_passages(beir, stats))
        return stats

    return _converted_once(work_dir, stamp, spec, convert)


def _head(task: str, dataset: str, split: str, name: str | None) -> dict:
    return {"task": task, "dataset": dataset, "split": split, **({"name": name} if name else {})}


@dataclass(frozen=True)
class BeirHub:
    """A BEIR dataset of the hub (`BeIR/<name>` and `BeIR/<name>-qrels`, or a local mirror of them:
    `taser.data.hub_beir`), read through `datasets`; `cache_dir`: its cache (default: the hub's)."""

    name: str
    cache_dir: str | os.PathLike | None = None


def evaluate_beir(
    settings: RetrieverSettings,
    source: str | os.PathLike | BeirHub,
    out_dir: str | os.PathLike,
    split: str = "test",
    k: int = 100,
    ignore_identical_ids: bool = True,
    work_dir: str | os.PathLike | None = None,
    dataset: str | None = None,
    name: str | None = None,
) -> dict:
    """BEIR's nDCG@10, Recall@100 and MRR@10 of `settings`' retriever on a BEIR dataset: `source`
    is its directory (`corpus.jsonl`, `queries.jsonl`, `qrels/<split>.tsv`) or a `BeirHub`.

    `work_dir` (default `<out_dir>/beir-corpus`) keeps the corpus converted to a passages TSV and,
    unless `settings.bm25.index_dir` says otherwise, its BM25 index (`bm25-<backend>`): runs of
    several systems on one dataset share them. Writes `out_dir/run.trec` (after the identical-id
    rule) and `out_dir/results.json`; returns the results.
    """
    work = Path(work_dir) if work_dir else Path(out_dir) / "beir-corpus"
    if isinstance(source, BeirHub):
        beir = load_beir_hub(source.name, split, source.cache_dir)
        queries, qrels, default_name = beir.queries, beir.qrels, beir.name
        passages_tsv, counts = beir_hub_passages_tsv(beir, work)
    else:
        files = beir_files(source, split)
        (queries, qrels), default_name = read_beir_split(files), files.name
        passages_tsv, counts = beir_passages_tsv(files.corpus, work)
    return _evaluate_beir(settings, queries, qrels, passages_tsv, counts, work, out_dir, dataset or default_name, split, k, ignore_identical_ids, name)


def _evaluate_beir(settings: RetrieverSettings, queries: dict, qrels: dict, passages_tsv: Path, counts: dict, work: Path, out_dir,
                   dataset: str, split: str, k: int, ignore_identical_ids: bool, name: str | None) -> dict:
    settings = with_bm25_dir(settings, work / f"bm25-{settings.bm25.backend}")
    qids = list(queries)
    retrieved, meta = retrieve(settings, [queries[q] for q in qids], passages_tsv, k, out_dir)
    run = dict(zip(qids, retrieved))  # every judged query has an entry, as with BEIR's retrievers
    dropped = 0
    if ignore_identical_ids:
        run, dropped = drop_identical_ids(run)
    scores = per_query_metrics(run, qrels, ks=BEIR_KS)
    metrics = evaluate_qrels(run, qrels, ks=BEIR_KS, scores=scores)
    curve = success_curve(run, qrels, CURVE_K)
    out = Path(out_dir)
    write_trec_run(out / RUN_FILE, run, tag=f"taser-{meta['retriever']}")
    write_per_query(out / PER_QUERY_FILE, beir_records(scores))
    scored = metrics.pop("queries")
    results = {
        **with_system(_head("beir", dataset, split, name), meta),
        "queries": len(qids),
        "queries_scored": scored,
        "documents": counts["documents"],
        "corpus": {"passages": str(passages_tsv), **counts},
        "ignore_identical_ids": ignore_identical_ids,
        "identical_ids_dropped": dropped,
        "metrics": {key: round(value, 5) for key, value in metrics.items()},
        "top_k_curve": [round(v, 2) for v in curve],
        "run_file": RUN_FILE,
        "per_query_file": PER_QUERY_FILE,
        "summary": " / ".join(f"{key} {metrics[key]:.4f}" for key in BEIR_HEADLINE),
    }
    with atomic_open(out / "results.json") as f:
        json.dump(results, f, indent=2)
    log.info("BEIR %s (%s, %s split, %d queries): %s", results["dataset"], meta["retriever"], split, len(qids), results["summary"])
    return results


def evaluate_entity_questions(
    settings: RetrieverSettings,
    questions_dir: str | os.PathLike,
    passages_tsv: str | os.PathLike,
    out_dir: str | os.PathLike,
    split: str = "test",
    k: int = 100,
    match: str = "string",
    write_json: bool = True,
    name: str | None = None,
) -> dict:
    """Top-k accuracy per EntityQuestions relation and its macro average over relations.

    All questions are retrieved in one pass over `passages_tsv` (DPR's `psgs_w100.tsv`); each
    relation's DPR retrieval JSON goes to `out_dir/retrieval/<relation>.<split>.json` (unless
    `write_json` is false), then `out_dir/results.json`: `relations` (each one's question count
    and top-k), `top_k` and `top_k_curve` (macro averages), `top_k_micro` (over all questions).
    """
    relations = read_entity_questions(questions_dir, split)
    qa = [q for pairs in relations.values() for q in pairs]
    retrieved, meta = retrieve(settings, [q.question for q in qa], passages_tsv, k, out_dir)
    passages = fetch_passages(passages_tsv, {pid for ranked in retrieved for pid, _ in ranked})
    per_relation, start, ranks = {}, 0, []
    for relation, pairs in relations.items():
        part = retrieved[start : start + len(pairs)]
        start += len(pairs)
        per_relation[relation] = evaluate_retrieval(
            pairs, part, passages_tsv, Path(out_dir) / "retrieval", match, write_json=write_json,
            retrieval_file=f"{relation}.{split}.json", results_file=None, passages=passages, per_query_file=None, ranks_out=ranks,
        )
    # a question's id: <relation>:<its 0-based position in the relation's file>
    ids = [f"{relation}:{i}" for relation, pairs in relations.items() for i in range(len(pairs))]
    write_per_query(Path(out_dir) / PER_QUERY_FILE, qa_records(ids, ranks, [rel for rel, pairs in relations.items() for _ in pairs]))
    n = len(per_relation)
    macro = {str(kk): sum(r["top_k"][str(kk)] for r in per_relation.values()) / n for kk in DEFAULT_KS}
    curve = [sum(r["top_k_curve"][i] for r in per_relation.values()) / n for i in range(CURVE_K)]
    micro = {str(kk): sum(r["top_k"][str(kk)] * r["questions"] for r in per_relation.values()) / len(qa) for kk in DEFAULT_KS}
    results = {
        **with_system(_head("entity_questions", ENTITY_QUESTIONS, split, name), meta),
        "questions": len(qa),
        "match": match,
        "relations": {rel: {"questions": r["questions"], "top_k": r["top_k"]} for rel, r in per_relation.items()},
        "top_k": {kk: round(v, 2) for kk, v in macro.items()},
        "top_k_micro": {kk: round(v, 2) for kk, v in micro.items()},
        "top_k_curve": [round(v, 2) for v in curve],
        "per_query_file": PER_QUERY_FILE,
        "summary": f"macro average over {n} relations: " + format_topk({int(kk): v for kk, v in macro.items()}),
    }
    with atomic_open(Path(out_dir) / "results.json") as f:
        json.dump(results, f, indent=2)
    log.info("EntityQuestions (%s, %d relations, %d questions): %s", meta["retriever"], n, len(qa), results["summary"])
    return results
