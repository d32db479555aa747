"""BEIR-style IR metrics: nDCG@k, Recall@k and MRR@10 of a run against graded qrels.

Conventions follow trec_eval (which BEIR uses through pytrec_eval): gains are the graded
relevance values, the discount is log2(rank + 1), a document is relevant when its grade is
positive, and a run's documents are ranked by decreasing score, ties by decreasing doc id.

Metrics are averaged over the queries with at least one relevant document; such a query
missing from the run scores 0 (trec_eval -c), rather than being dropped.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

MRR_CUTOFF = 10


def _ranking(results: Sequence[tuple[str, float]]) -> list[str]:
    """Doc ids by decreasing score (ties: decreasing id), each id once."""
    seen: set[str] = set()
    ranked = []
    for docid, _ in sorted(results, key=lambda r: (r[1], r[0]), reverse=True):
        if docid not in seen:
            seen.add(docid)
            ranked.append(docid)
    return ranked


def _dcg(gains: Sequence[float]) -> float:
    return sum(g / math.log2(i + 2) for i, g in enumerate(gains))


def _ndcg(ranked: list[str], judged: Mapping[str, int], k: int) -> float:
    ideal = _dcg(sorted((g for g in judged.values() if g > 0), reverse=True)[:k])
    gains = [max(judged.get(d, 0), 0) for d in ranked[:k]]
    return _dcg(gains) / ideal


def _recall(ranked: list[str], relevant: set[str], k: int) -> float:
    return sum(1 for d in ranked[:k] if d in relevant) / len(relevant)


def _reciprocal_rank(ranked: list[str], relevant: set[str], k: int) -> float:
    for i, d in enumerate(ranked[:k]):
        if d in relevant:
            return 1.0 / (i + 1)
    return 0.0


def evaluate_qrels(
    run: Mapping[str, Sequence[tuple[str, float]]],
    qrels: Mapping[str, Mapping[str, int]],
    ks: Sequence[int] = (10, 100),
) -> dict[str, float]:
    """Mean nDCG@k and Recall@k for each k in `ks`, and MRR@10, as fractions in [0, 1].

    `run` maps a query id to its retrieved (doc id, score) pairs; `qrels` maps a query id to
    {doc id: relevance grade}. Keys: "nDCG@10", "Recall@10", ..., "MRR@10".
    """
    if any(k < 1 for k in ks):
        raise ValueError(f"k must be positive, got {list(ks)}")
    totals = {f"nDCG@{k}": 0.0 for k in ks} | {f"Recall@{k}": 0.0 for k in ks}
    totals[f"MRR@{MRR_CUTOFF}"] = 0.0
    n = 0
    for qid, judged in qrels.items():
        relevant = {d for d, g in judged.items() if g > 0}
        if not relevant:
            continue
        n += 1
        ranked = _ranking(run.get(qid, ()))
        for k in ks:
            totals[f"nDCG@{k}"] += _ndcg(ranked, judged, k)
            totals[f"Recall@{k}"] += _recall(ranked, relevant, k)
        totals[f"MRR@{MRR_CUTOFF}"] += _reciprocal_rank(ranked, relevant, MRR_CUTOFF)
    if n == 0:
        raise ValueError("no query in qrels has a relevant document")
    return {name: total / n for name, total in totals.items()}
