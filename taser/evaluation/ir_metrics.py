"""BEIR's metrics, computed by `pytrec_eval` (trec_eval's own C code): nDCG@k, Recall@k, MRR@10
and the top-k accuracy curve (trec_eval's `success@k`: a relevant document in the first k).

Conventions, those of BEIR's `EvaluateRetrieval.evaluate`:

- A run is {query id: [(doc id, score), ...]}. trec_eval ranks each query's documents by
  decreasing score, ties by decreasing doc id (not by the list's order); a doc id listed twice
  keeps its first score. A document is relevant when its grade is positive; nDCG's gains are
  the grades, its discount log2(rank + 1); unjudged documents gain 0.
- Identical ids: with `ignore_identical_ids` (BEIR's default) a hit whose doc id equals its
  query id is dropped before evaluating (`drop_identical_ids`); it matters on corpora whose
  queries are documents too (ArguAna, Quora, CQADupStack).
- Averages are over the queries pytrec_eval scores: the judged queries the run holds. A query
  with an empty list is held (it scores 0), so a run that, like BEIR's retrievers, has an
  entry for every judged query is averaged over all of them, including queries whose
  judgements are all 0 (which score 0 everywhere). `judged_run` makes such a run.
- MRR@10 is trec_eval's reciprocal rank of the first relevant document when it is within the
  first 10, else 0. (BEIR's own MRR code breaks score ties by list order; with no ties the two agree.)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytrec_eval

MRR_CUTOFF = 10

Run = Mapping[str, Sequence[tuple[str, float]]]
Qrels = Mapping[str, Mapping[str, int]]


def drop_identical_ids(run: Run) -> tuple[dict[str, list[tuple[str, float]]], int]:
    """(the run without hits whose doc id is their query id, how many were dropped)."""
    dropped = 0
    kept: dict[str, list[tuple[str, float]]] = {}
    for qid, hits in run.items():
        kept[qid] = [(docid, score) for docid, score in hits if docid != qid]
        dropped += len(hits) - len(kept[qid])
    return kept, dropped


def judged_run(run: Run, qrels: Qrels) -> dict[str, list[tuple[str, float]]]:
    """The run restricted to the judged queries, with an (empty) entry for each of them."""
    return {qid: list(run.get(qid, ())) for qid in qrels}


def _trec_run(run: Run) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for qid, hits in run.items():
        scores: dict[str, float] = {}
        for docid, score in hits:
            scores.setdefault(str(docid), float(score))
        out[str(qid)] = scores
    return out


def _checked_qrels(qrels: Qrels) -> dict[str, dict[str, int]]:
    if not qrels:
        raise ValueError("no judged query (empty qrels)")
    return {str(q): {str(d): int(g) for d, g in judged.items()} for q, judged in qrels.items()}


def per_query(run: Run, qrels: Qrels, measures: set[str]) -> dict[str, dict[str, float]]:
    """pytrec_eval's per-query values of trec_eval `measures` (e.g. {"ndcg_cut.10", "recip_rank"})."""
    return pytrec_eval.RelevanceEvaluator(_checked_qrels(qrels), measures).evaluate(_trec_run(run))


def _mean(scores: dict[str, dict[str, float]], key: str) -> float:
    return sum(s[key] for s in scores.values()) / len(scores)


def per_query_metrics(run: Run, qrels: Qrels, ks: Sequence[int] = (10, 100), mrr_cutoff: int = MRR_CUTOFF) -> dict[str, dict[str, float]]:
    """Per scored query (judged and in the run, in the qrels' order): nDCG@k and Recall@k for each
    k in `ks`, and "MRR@`mrr_cutoff`" (its reciprocal rank when the first relevant document is within
    the cut-off, else 0). Their means are `evaluate_qrels`."""
    if any(k < 1 for k in ks) or mrr_cutoff < 1:
        raise ValueError(f"cut-offs must be positive, got {list(ks)} and {mrr_cutoff}")
    cut = ",".join(str(k) for k in sorted(set(ks)))
    scores = per_query(run, qrels, {f"ndcg_cut.{cut}", f"recall.{cut}", "recip_rank"})
    out: dict[str, dict[str, float]] = {}
    for qid in (str(q) for q in qrels):
        if qid not in scores:
            continue
        s = scores[qid]
        values = {f"nDCG@{k}": s[f"ndcg_cut_{k}"] for k in ks}
        values.update({f"Recall@{k}": s[f"recall_{k}"] for k in ks})
        # reciprocal rank r counts when the first relevant rank 1/r is at most the cut-off
        values[f"MRR@{mrr_cutoff}"] = s["recip_rank"] if s["recip_rank"] * mrr_cutoff >= 1 - 1e-9 else 0.0
        out[qid] = values
    return out


def evaluate_qrels(run: Run, qrels: Qrels, ks: Sequence[int] = (10, 100), mrr_cutoff: int = MRR_CUTOFF,
                   scores: dict[str, dict[str, float]] | None = None) -> dict[str, float]:
    """Mean nDCG@k and Recall@k for each k in `ks`, and MRR@`mrr_cutoff`, as fractions in [0, 1].

    Keys: "nDCG@10", "Recall@10", ..., "MRR@10", and "queries" (how many were averaged).
    `scores`: `per_query_metrics` of the same arguments, when the caller has them already.
    """
    scores = per_query_metrics(run, qrels, ks, mrr_cutoff) if scores is None else scores
    if not scores:
        raise ValueError("the run holds none of the judged queries")
    keys = [f"nDCG@{k}" for k in ks] + [f"Recall@{k}" for k in ks] + [f"MRR@{mrr_cutoff}"]
    out: dict[str, float] = {key: _mean(scores, key) for key in keys}
    out["queries"] = len(scores)
    return out


def success_curve(run: Run, qrels: Qrels, max_k: int = 100) -> list[float]:
    """Top-k accuracy in percent for k = 1..max_k: the share of queries with a relevant
    document among their first k (trec_eval's success@k), averaged like `evaluate_qrels`."""
    if max_k < 1:
        raise ValueError(f"max_k must be positive, got {max_k}")
    scores = per_query(run, qrels, {"success." + ",".join(str(k) for k in range(1, max_k + 1))})
    if not scores:
        raise ValueError("the run holds none of the judged queries")
    return [100.0 * _mean(scores, f"success_{k}") for k in range(1, max_k + 1)]
