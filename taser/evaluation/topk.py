"""Top-k retrieval accuracy: the share of questions with an answer in their first k passages."""

from __future__ import annotations

from collections.abc import Sequence

DEFAULT_KS = (1, 5, 20, 100)
CURVE_K = 100  # results.json keeps the accuracy at every k up to this, for the report's curves


def first_hit_ranks(hits: Sequence[Sequence[bool]]) -> list[int | None]:
    """Per question, the 1-based rank of its first passage with an answer (None: none retrieved);
    a question is a hit at k exactly when its rank is at most k."""
    return [next((i + 1 for i, h in enumerate(q) if h), None) for q in hits]


def accuracy_from_ranks(ranks: Sequence[int | None], ks: Sequence[int] = DEFAULT_KS) -> dict[int, float]:
    """Top-k accuracy in percent, for each k in `ks`, from each question's first-hit rank."""
    if not ranks:
        raise ValueError("top-k accuracy of no questions")
    if any(k < 1 for k in ks):
        raise ValueError(f"k must be positive, got {list(ks)}")
    n = len(ranks)
    return {k: 100.0 * sum(1 for r in ranks if r is not None and r <= k) / n for k in sorted(ks)}


def top_k_accuracy(hits: Sequence[Sequence[bool]], ks: Sequence[int] = DEFAULT_KS) -> dict[int, float]:
    """Top-k accuracy in percent, for each k in `ks`.

    `hits[q][i]` says whether the i-th retrieved passage of question q has an answer. A
    question with fewer than k passages is judged on those it has.
    """
    if not hits:
        raise ValueError("top-k accuracy of no questions")
    return accuracy_from_ranks(first_hit_ranks(hits), ks)


def format_topk(acc: dict[int, float]) -> str:
    """One line such as "top-1 46.1 / top-5 75.6 / top-20 90.0"."""
    return " / ".join(f"top-{k} {acc[k]:.1f}" for k in sorted(acc))
