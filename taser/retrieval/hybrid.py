"""Hybrid retrieval: fuse one question's BM25 and dense result lists into one ranking.

Candidates are the union of the two lists (each is that retriever's top-N for the question).
Each candidate gets a BM25 score `s` and a dense score `d`; a candidate missing from a list
gets **that list's minimum score for this question**. Rationale: the passage ranked below the
list's last entry, so the minimum is the best score it could have had (an upper bound, and the
choice of pyserini's `HybridSearcher`); a constant such as 0 would be wrong for dense scores,
which may be negative or far from 0. An empty list contributes 0 to every candidate.

Two rules, both with λ weighting the *dense* side:

- `"dpr"` (Karpukhin et al. 2020, section 5.1, λ = 1.1): `score = s + λ·d` on raw scores.
  DPR reranked the union of each retriever's top-2000; the paper does not say how a missing
  score was filled in, hence the rule above.
- `"normalized"`: pyserini's `HybridSearcher(normalization=True, weight_on_dense=True)`. Each
  list is min-max normalised per question and centred, `x' = (x - (min + max) / 2) / (max - min)`
  (so scores lie in [-1/2, 1/2], and a missing passage gets -1/2), then `score = s' + λ·d'`.
  The centring adds the same constant (-(1 + λ)/2 relative to [0, 1] scaling) to every
  candidate, so the ranking equals plain [0, 1] min-max normalisation. A list whose scores are
  all equal (max = min, e.g. a single hit) normalises to 0. pyserini's default
  (`weight_on_dense=False`) computes `α·s' + d'`, which ranks as λ = 1/α here.

The fused list is sorted by score, best first; ties are broken by the better rank in the dense
list, then in the BM25 list (so the order is deterministic).

Choosing λ: `tune_lambda` fuses a dev set's lists for every λ of a grid and returns the one
with the best top-k accuracy (ties: the better top-1, then the first in the grid):

    bm25 = bm25_index.batch_search(questions, k=100)
    dense = dense_retrieve(model, tokenizer, index, questions, k=100)
    best, table = tune_lambda([q.answers for q in dev_qa], bm25, dense, PassageStore(tsv), k=20)

then evaluate on the test questions with `fuse_many(..., lam=best)` (never tune on the test set).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from taser.choice import Choice
from taser.evaluation.answers import has_answer
from taser.evaluation.topk import top_k_accuracy

Hit = tuple[str, float]


class HybridRule(Choice):
    dpr = "dpr"  # bm25 + lambda * dense
    normalized = "normalized"  # pyserini's per-question min-max normalisation


RULES = HybridRule.names()
DPR_LAMBDA = 1.1
DEFAULT_GRID = (0.0, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 1.1, 1.3, 1.5, 2.0, 3.0, 5.0, 10.0)


def _scores(hits: Sequence[Hit]) -> dict[str, float]:
    scores: dict[str, float] = {}
    for pid, score in hits:
        scores.setdefault(pid, float(score))  # a repeated id keeps its best (first) score
    return scores


def _normalizer(scores: dict[str, float]):
    if not scores:
        return lambda x: 0.0
    lo, hi = min(scores.values()), max(scores.values())
    if hi == lo:
        return lambda x: 0.0
    mid, span = (lo + hi) / 2, hi - lo
    return lambda x: (x - mid) / span


def fuse(bm25: Sequence[Hit], dense: Sequence[Hit], lam: float = DPR_LAMBDA, rule: str = "dpr",
         k: int | None = None) -> list[Hit]:
    """One question's fused ranking (see the module notes); the first `k` when k is given."""
    rule = HybridRule.parse(rule, "hybrid rule")
    sparse, dense_scores = _scores(bm25), _scores(dense)
    sparse_missing = min(sparse.values()) if sparse else 0.0
    dense_missing = min(dense_scores.values()) if dense_scores else 0.0
    identity = lambda x: x  # noqa: E731  (an empty list's "missing" score is already 0)
    norm_s = _normalizer(sparse) if rule == "normalized" else identity
    norm_d = _normalizer(dense_scores) if rule == "normalized" else identity
    dense_rank = {pid: i for i, pid in enumerate(dense_scores)}
    sparse_rank = {pid: i for i, pid in enumerate(sparse)}
    last = len(dense_scores) + len(sparse)
    fused = []
    for pid in dict.fromkeys([*dense_scores, *sparse]):
        s = norm_s(sparse.get(pid, sparse_missing))
        d = norm_d(dense_scores.get(pid, dense_missing))
        fused.append((s + lam * d, dense_rank.get(pid, last), sparse_rank.get(pid, last), pid))
    fused.sort(key=lambda f: (-f[0], f[1], f[2]))
    return [(pid, score) for score, _, _, pid in fused[:k]]


def fuse_many(bm25: Sequence[Sequence[Hit]], dense: Sequence[Sequence[Hit]], lam: float = DPR_LAMBDA,
              rule: str = "dpr", k: int | None = None) -> list[list[Hit]]:
    """`fuse` for each question; the two lists of lists are in the same question order."""
    if len(bm25) != len(dense):
        raise ValueError(f"{len(bm25)} BM25 result lists but {len(dense)} dense ones")
    return [fuse(b, d, lam, rule, k) for b, d in zip(bm25, dense)]


def _passage_texts(passages, ids: Iterable[str]) -> dict[str, str]:
    """Texts of `ids` from a PassageStore (anything with `get_many`) or a mapping id -> Passage."""
    ids = set(ids)
    if hasattr(passages, "get_many"):
        return {pid: p.text for pid, p in passages.get_many(ids).items()}
    return {pid: passages[pid].text for pid in ids}


def tune_lambda(answers: Sequence[Sequence[str]], bm25: Sequence[Sequence[Hit]], dense: Sequence[Sequence[Hit]],
                passages, grid: Sequence[float] = DEFAULT_GRID, k: int = 20, rule: str = "dpr",
                match: str = "string") -> tuple[float, dict[float, dict[int, float]]]:
    """The λ of `grid` with the best top-k accuracy of the fused lists on a dev set.

    `answers[q]`, `bm25[q]` and `dense[q]` belong to question q; `passages` gives passage texts
    (a `PassageStore`, or a mapping id -> Passage). Returns (best λ, {λ: {1: top-1, k: top-k}}).
    Answer matching is done once per (question, passage), not once per λ.
    """
    if not grid:
        raise ValueError("tune_lambda needs a non-empty grid of λ values")
    if not len(answers) == len(bm25) == len(dense):
        raise ValueError(f"{len(answers)} questions, {len(bm25)} BM25 lists and {len(dense)} dense lists")
    texts = _passage_texts(passages, (pid for lists in (bm25, dense) for hits in lists for pid, _ in hits))
    judged: list[Mapping[str, bool]] = [
        {pid: has_answer(ans, texts[pid], match) for pid in {p for p, _ in [*b, *d]}}
        for ans, b, d in zip(answers, bm25, dense)
    ]
    table: dict[float, dict[int, float]] = {}
    for lam in grid:
        fused = fuse_many(bm25, dense, lam, rule, k)
        hits = [[hit[pid] for pid, _ in ranked] for hit, ranked in zip(judged, fused)]
        table[float(lam)] = top_k_accuracy(hits, (1, k))
    best = max(table, key=lambda lam: (table[lam][k], table[lam][1]))  # max keeps the first of ties
    return best, table
