"""Statistics over questions: a paired randomization test, Holm's correction, and a bootstrap
confidence interval, each on per-question outcomes (`taser.evaluation.per_query`).

A dataset's figure is a weighted mean of per-question outcomes, sum_i w_i x_i with sum_i w_i = 1:
equal weights for a QA file or BEIR, 1 / (relations x the relation's questions) for
EntityQuestions' macro average. Both tests below use that weighted mean.

- `paired_test`: two systems on the same questions, the difference of their figures; under the
  null hypothesis each question's pair of outcomes is exchangeable, so the test flips the sign
  of each question's difference at random (`scipy.stats.permutation_test`, permutation_type
  "samples", two-sided). With n questions and 2**n <= `resamples` every flip is enumerated (an
  exact test, whose smallest p-value is 2 / 2**n); otherwise `resamples` random flips, whose
  smallest p-value is 2 / (resamples + 1) (scipy counts the observed statistic among them).
  Identical outcomes give p = 1.
- `holm`: Holm's step-down adjustment of several p-values (family-wise error rate).
- `bootstrap_interval`: the percentile interval of the weighted mean over questions resampled with
  replacement (`scipy.stats.bootstrap`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

DEFAULT_RESAMPLES = 10_000
BATCH = 500  # resamples evaluated at once: bounds memory at BATCH x questions floats


def _weights(n: int, weights) -> np.ndarray:
    if weights is None:
        return np.full(n, 1.0 / n)
    w = np.asarray(weights, dtype=float)
    if w.shape != (n,) or (w < 0).any() or w.sum() <= 0:
        raise ValueError(f"weights must be {n} non-negative numbers with a positive sum")
    return w / w.sum()


def _paired(a, b) -> tuple[np.ndarray, np.ndarray]:
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.ndim != 1 or a.shape != b.shape or not len(a):
        raise ValueError(f"paired outcomes must be two equal-length, non-empty 1-d sequences, got shapes {a.shape} and {b.shape}")
    return a, b


def paired_test(a: Sequence[float], b: Sequence[float], weights: Sequence[float] | None = None,
                resamples: int = DEFAULT_RESAMPLES, seed: int = 0) -> float:
    """Two-sided p-value of the paired randomization test of sum_i w_i (a_i - b_i) = 0."""
    from scipy.stats import permutation_test

    a, b = _paired(a, b)
    w = _weights(len(a), weights)

    def statistic(x, y, axis=-1):
        return np.sum(w * (x - y), axis=axis)

    result = permutation_test((a, b), statistic, permutation_type="samples", vectorized=True, n_resamples=resamples,
                              alternative="two-sided", batch=BATCH, rng=np.random.default_rng(seed))
    return float(result.pvalue)


def smallest_p(n_questions: int, resamples: int = DEFAULT_RESAMPLES) -> float:
    """The smallest p-value `paired_test` can return for n questions (exact below 2**n <= resamples)."""
    if n_questions < 64 and 2**n_questions <= resamples:
        return 2.0 / 2**n_questions
    return 2.0 / (resamples + 1)


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the order given: the i-th smallest of m is multiplied by
    (m - i + 1), kept at least the previous adjusted value, and capped at 1."""
    order = sorted(range(len(pvalues)), key=lambda i: pvalues[i])
    adjusted, running = [0.0] * len(pvalues), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(pvalues) - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted


def bootstrap_interval(values: Sequence[float], weights: Sequence[float] | None = None, confidence: float = 0.95,
                       resamples: int = DEFAULT_RESAMPLES, seed: int = 0) -> tuple[float, float]:
    """The `confidence` percentile-bootstrap interval of the weighted mean of `values` over questions."""
    from scipy.stats import bootstrap

    x = np.asarray(values, dtype=float)
    if x.ndim != 1 or not len(x):
        raise ValueError("bootstrap of no values")
    w = _weights(len(x), weights)
    if np.all(x == x[0]):
        return float(x[0]), float(x[0])  # every resample has the same mean

    def statistic(v, u, axis=-1):
        return np.sum(v * u, axis=axis) / np.sum(u, axis=axis)

    result = bootstrap((x, w), statistic, paired=True, vectorized=True, n_resamples=resamples, confidence_level=confidence,
                       method="percentile", batch=BATCH, rng=np.random.default_rng(seed))
    return float(result.confidence_interval.low), float(result.confidence_interval.high)
