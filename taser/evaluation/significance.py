"""Statistics over questions: a paired randomization test, Holm's correction, and a bootstrap
confidence interval, each on per-question outcomes (`taser.evaluation.per_query`).

A dataset's figure is a weighted mean of per-question outcomes, sum_i w_i x_i with sum_i w_i = 1:
equal weights for a QA file or BEIR, 1 / (relations x the relation's questions) for
EntityQuestions' macro average. Both tests below use that weighted mean.

- `paired_test`: two systems on the same questions, the difference of their figures; under the
  null hypothesis each question's pair of outcomes is exchangeable, so the test flips the sign
  of each question's difference. Its p-value is exact whenever the weighted differences lie on a
  common lattice (`exact_sign_flip_p`: top-k and EM outcomes, averaged over a few seeds, take a
  few values): the distribution of the sum of the flipped differences is the convolution of one
  binomial per distinct magnitude, computed exactly, so there is no resampling noise and no floor.
  Otherwise (continuous metrics: nDCG, MRR) `resamples` random flips (`scipy.stats.permutation_test`),
  whose smallest p-value is 2 / (resamples + 1). Identical outcomes give p = 1. `alternative`
  "less" / "greater" gives the one-sided p-value, P(sum <= observed) / P(sum >= observed), of the
  same distribution (the encoding backends' gate, `taser.evaluation.encoding_gate`, asks "less").
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


EXACT_SUPPORT = 1_000_000  # lattice points of the exact distribution at most (beyond: Monte Carlo)
EXACT_WORK = 300_000_000  # multiply-adds of the convolution at most (beyond: Monte Carlo)


def _lattice(magnitudes: np.ndarray, max_total: int, max_denominator: int = 720) -> np.ndarray | None:
    """Integers k with magnitudes = k x (a common unit), or None when they have none within
    `max_denominator` of the smallest (a few seeds' averages of 0/1 outcomes always do), or when
    the integers would sum past `max_total`. Python integers throughout: no overflow."""
    from fractions import Fraction
    from math import lcm

    unit = float(magnitudes.min())
    ratios = {}
    for value in np.unique(magnitudes):
        r = float(value) / unit
        f = Fraction(r).limit_denominator(max_denominator)
        if abs(float(f) - r) > 1e-9 * max(1.0, r):
            return None
        ratios[float(value)] = f
    scale = lcm(*(f.denominator for f in ratios.values()))
    counts = dict(zip(*np.unique(magnitudes, return_counts=True)))
    if sum(int(ratios[float(v)] * scale) * int(c) for v, c in counts.items()) > max_total:
        return None
    return np.array([int(ratios[float(v)] * scale) for v in magnitudes], dtype=np.int64)


ALTERNATIVES = ("two-sided", "less", "greater")


def _alternative(alternative: str) -> str:
    if alternative not in ALTERNATIVES:
        raise ValueError(f"alternative must be one of {ALTERNATIVES}, got {alternative!r}")
    return alternative


def exact_sign_flip_p(differences: Sequence[float], weights: Sequence[float] | None = None, max_support: int = EXACT_SUPPORT,
                      max_work: int = EXACT_WORK, alternative: str = "two-sided") -> float | None:
    """The exact p-value of the sign-flip test of sum_i w_i d_i = 0 over the 2**n equally likely signs:
    two-sided P(|sum_i s_i w_i d_i| >= |observed|), "less" P(sum <= observed), "greater" P(sum >= observed);
    or None when the w_i d_i share no small lattice (see `_lattice`) or the convolution would exceed
    `max_work` operations (the caller then resamples)."""
    from scipy.stats import binom

    _alternative(alternative)
    d = np.asarray(differences, dtype=float)
    x = d * _weights(len(d), weights)
    keep = np.abs(x) > 1e-15 * max(1.0, float(np.abs(x).max(initial=0.0)))
    if not keep.any():
        return 1.0
    k = _lattice(np.abs(x[keep]), max_support)
    if k is None:
        return None
    observed = int(np.sum(np.sign(x[keep]) * k))
    total = int(k.sum())
    groups = list(zip(*np.unique(k, return_counts=True)))
    if (2 * total + 1) * sum(int(c) + 1 for _, c in groups) > max_work:
        return None
    # P(sum = v) at index v + total; each magnitude adds count + 1 shifted copies (j of count signs positive)
    dist = np.zeros(2 * total + 1)
    dist[total] = 1.0
    reach = 0  # the support so far: [-reach, reach]
    for value, count in groups:
        value, count = int(value), int(count)
        pmf = binom.pmf(np.arange(count + 1), count, 0.5)
        current = dist[total - reach : total + reach + 1].copy()
        reach += value * count
        dist[:] = 0.0
        for j, weight in enumerate(pmf):
            shift = value * (2 * j - count)
            start = total - (reach - value * count) + shift
            dist[start : start + len(current)] += weight * current
    values = np.arange(-total, total + 1)
    tail = {"two-sided": np.abs(values) >= abs(observed), "less": values <= observed, "greater": values >= observed}[alternative]
    p = float(dist[tail].sum())
    return min(1.0, float(f"{p:.12g}"))  # the sum's last bits are rounding: 2/64 prints as 0.0625, not 0.06250000000000001


def sign_flip_test(a: Sequence[float], b: Sequence[float], weights: Sequence[float] | None = None,
                   resamples: int = DEFAULT_RESAMPLES, seed: int = 0, alternative: str = "two-sided") -> tuple[float, str]:
    """(p, how): the paired sign-flip test's p-value of sum_i w_i (a_i - b_i) = 0 (two-sided, or one-sided:
    "less" when a's figure is below b's), exact where `exact_sign_flip_p` can compute it ("exact"), else
    over `resamples` random flips ("Monte Carlo, N flips")."""
    a, b = _paired(a, b)
    exact = exact_sign_flip_p(a - b, weights, alternative=alternative)
    if exact is not None:
        return exact, "exact"
    return _monte_carlo_p(a, b, weights, resamples, seed, alternative), f"Monte Carlo, {resamples} flips"


def paired_test(a: Sequence[float], b: Sequence[float], weights: Sequence[float] | None = None,
                resamples: int = DEFAULT_RESAMPLES, seed: int = 0) -> float:
    """Two-sided p-value of the paired sign-flip test of sum_i w_i (a_i - b_i) = 0 (exact where it can be)."""
    return sign_flip_test(a, b, weights, resamples, seed)[0]


def _monte_carlo_p(a, b, weights, resamples: int, seed: int, alternative: str = "two-sided") -> float:
    from scipy.stats import permutation_test

    a, b = _paired(a, b)
    w = _weights(len(a), weights)

    def statistic(x, y, axis=-1):
        return np.sum(w * (x - y), axis=axis)

    result = permutation_test((a, b), statistic, permutation_type="samples", vectorized=True, n_resamples=resamples,
                              alternative=_alternative(alternative), batch=BATCH, rng=np.random.default_rng(seed))
    return float(result.pvalue)


def smallest_p(n_questions: int, resamples: int = DEFAULT_RESAMPLES, exact: bool = True) -> float:
    """The smallest p-value `paired_test` can return for n questions: 2 / 2**n when exact (it is
    exact wherever the outcomes lie on a lattice), else 2 / (resamples + 1)."""
    return 2.0 / 2**n_questions if exact else 2.0 / (resamples + 1)


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
