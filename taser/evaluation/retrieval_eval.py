"""Judge retrieved passages against answers and write DPR's retrieval JSON and `results.json`.

Passage texts come from a `PassageStore` (byte offsets of the TSV's rows), so a 21M-passage
corpus is never held in memory.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

from taser.data.passage_store import PassageStore
from taser.data.passages import Passage
from taser.data.qa import QAPair
from taser.data.retrieval_json import write_retrieval_results
from taser.evaluation.answers import has_answer
from taser.evaluation.per_query import PER_QUERY_FILE, qa_records, write_per_query
from taser.evaluation.topk import CURVE_K, DEFAULT_KS, accuracy_from_ranks, first_hit_ranks, format_topk
from taser.io import atomic_open

Ranked = Sequence[tuple[str, float]]


def fetch_passages(passages_tsv: str | os.PathLike, ids: set[str]) -> dict[str, Passage]:
    store = PassageStore(passages_tsv)
    try:
        return store.get_many(ids)
    except KeyError as e:
        raise ValueError(f"{passages_tsv}: retrieved passages missing from the corpus: {e.args[0]}") from None
    finally:
        store.close()


def judge(qa: Sequence[QAPair], retrieved: Sequence[Ranked], passages: dict[str, Passage], match: str) -> list[list[bool]]:
    return [[has_answer(q.answers, passages[pid].text, match) for pid, _ in ranked] for q, ranked in zip(qa, retrieved)]


def evaluate_retrieval(
    qa: Sequence[QAPair],
    retrieved: Sequence[Ranked],
    passages_tsv: str | os.PathLike,
    out_dir: str | os.PathLike,
    match: str = "string",
    ks: Sequence[int] = DEFAULT_KS,
    meta: dict | None = None,
    write_json: bool = True,
    curve_k: int = CURVE_K,
    retrieval_file: str = "retrieval.json",
    results_file: str | None = "results.json",
    passages: dict[str, Passage] | None = None,
    per_query_file: str | None = PER_QUERY_FILE,
    ids: Sequence[str] | None = None,
    ranks_out: list | None = None,
) -> dict:
    """Top-k accuracy of `retrieved` (per question: (passage id, score) best first).

    Writes `out_dir/<retrieval_file>` (DPR's format) and `out_dir/<results_file>` (unless None);
    returns the results: `meta`, the question count, `top_k` at `ks` and `top_k_curve`, the
    accuracy at k = 1..`curve_k` (for the report's plots). `passages`: the retrieved passages,
    when the caller has read them already (several evaluations over one large corpus).

    `out_dir/<per_query_file>` (unless None; `taser.evaluation.per_query`): each question's id
    (`ids`, default its 0-based position) and the rank of its first passage with an answer.
    `ranks_out`, when given, is extended by those ranks (a caller that writes its own file).
    """
    if len(qa) != len(retrieved):
        raise ValueError(f"{len(qa)} questions but {len(retrieved)} result lists")
    if passages is None:
        passages = fetch_passages(passages_tsv, {pid for ranked in retrieved for pid, _ in ranked})
    if ids is not None and len(ids) != len(qa):
        raise ValueError(f"{len(qa)} questions but {len(ids)} ids")
    hits = judge(qa, retrieved, passages, match)
    ranks = first_hit_ranks(hits)
    acc = accuracy_from_ranks(ranks, ks)
    curve = accuracy_from_ranks(ranks, range(1, curve_k + 1))
    if ranks_out is not None:
        ranks_out.extend(ranks)
    out = Path(out_dir)
    if write_json:
        records = (
            {
                "question": q.question,
                "answers": q.answers,
                "ctxs": [
                    {"id": pid, "title": passages[pid].title, "text": passages[pid].text, "score": float(score), "has_answer": h}
                    for (pid, score), h in zip(ranked, hit)
                ],
            }
            for q, ranked, hit in zip(qa, retrieved, hits)
        )
        write_retrieval_results(out / retrieval_file, records)
    results = {**(meta or {}), "questions": len(qa), "match": match, "top_k": {str(k): round(v, 2) for k, v in acc.items()}, "summary": format_topk(acc),
               "top_k_curve": [round(curve[k], 2) for k in range(1, curve_k + 1)]}
    if per_query_file is not None:
        write_per_query(out / per_query_file, qa_records(ids if ids is not None else [str(i) for i in range(len(qa))], ranks))
        results["per_query_file"] = per_query_file
    if results_file is not None:
        with atomic_open(out / results_file) as f:
            json.dump(results, f, indent=2)
    return results
