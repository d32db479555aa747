"""The statistics on hand-computable cases: the paired randomization test, Holm's correction, the
bootstrap interval, and the aggregation over seeds."""

import math

import numpy as np
import pytest

from taser.evaluation.seeds import mean_outcomes, over_seeds
from taser.evaluation.significance import bootstrap_interval, holm, paired_test, smallest_p


def test_identical_systems_give_p_one():
    a = [1, 0, 1, 1, 0, 1, 0, 0, 1, 1]
    assert paired_test(a, a) == 1.0  # exact: 2^10 flips, every one gives the observed 0
    many = np.random.default_rng(0).integers(0, 2, 500).astype(float)
    assert paired_test(many, many, resamples=999) == 1.0  # Monte Carlo


def test_winning_every_question_gives_the_smallest_p():
    # exact test (2^n <= resamples): only "all +1" and "all -1" reach |statistic| = n, so p = 2 / 2^n
    for n in (4, 8, 12):
        assert paired_test([1.0] * n, [0.0] * n) == pytest.approx(2 / 2**n) == smallest_p(n)
    # exact however many questions (no floor of 2 / (resamples + 1)): outcomes on a lattice
    assert paired_test([1.0] * 40, [0.0] * 40, resamples=999) == pytest.approx(2 / 2**40, rel=1e-9) == smallest_p(40)
    # Monte Carlo only where the differences share no lattice: no random flip reaches the observed, and scipy
    # counts the observed itself: 2 / (resamples + 1)
    irrational = [1.0 + (2**0.5) * (i % 2) + 1e-3 * 3**0.5 * i for i in range(40)]
    assert paired_test(irrational, [0.0] * 40, resamples=999) == pytest.approx(2 / 1000) == smallest_p(40, 999, exact=False)
    # and on percent outcomes, as the report passes them
    assert paired_test([100.0] * 8, [0.0] * 8) == pytest.approx(2 / 256)


def test_paired_test_by_hand_and_symmetry():
    # differences (+1, +1, -1) with 3 questions: |sum| of the 8 sign flips is 1 six times and 3 twice; observed 1 -> p = 1
    assert paired_test([1, 1, 0], [0, 0, 1]) == pytest.approx(1.0)
    # differences (+1, +1, +1, 0): flips give |sum| 3 in 4 of 16 (the zero's sign is free) -> p = 4/16
    assert paired_test([1, 1, 1, 0], [0, 0, 0, 0]) == pytest.approx(4 / 16)
    rng = np.random.default_rng(1)
    a, b = rng.integers(0, 2, 300).astype(float), rng.integers(0, 2, 300).astype(float)
    assert paired_test(a, b, resamples=2000) == pytest.approx(paired_test(b, a, resamples=2000))
    with pytest.raises(ValueError, match="equal-length"):
        paired_test([1, 0], [1])


def test_weights_enter_the_statistic():
    # differences (+1, +1, +1, -1) over 16 sign flips. Equal weights: observed 0.5, and 5 flips reach
    # T >= 0.5 -> p = 2 x 5/16. Weights (0.3, 0.3, 0.3, 0.1): observed 0.8, reached only when the first
    # three keep their sign (2 flips) -> p = 2 x 2/16
    a, b = [1, 1, 1, 0], [0, 0, 0, 1]
    assert paired_test(a, b) == pytest.approx(10 / 16)
    assert paired_test(a, b, weights=[0.3, 0.3, 0.3, 0.1]) == pytest.approx(4 / 16)


def test_holm_by_hand():
    # sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1: 0.02, 0.03, 0.06, 0.04 -> made monotone: 0.02, 0.03, 0.06, 0.06
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])  # capped at 1
    assert holm([0.04]) == [0.04] and holm([]) == []


def test_bootstrap_interval():
    assert bootstrap_interval([100.0] * 20) == (100.0, 100.0)
    x = np.random.default_rng(2).integers(0, 2, 2000) * 100.0
    low, high = bootstrap_interval(x, resamples=2000)
    se = math.sqrt(x.mean() * (100 - x.mean()) / len(x))
    assert low < x.mean() < high and high - low == pytest.approx(2 * 1.96 * se, rel=0.15)
    assert bootstrap_interval(x, resamples=2000) == (low, high)  # seeded: reproducible


def test_aggregation_over_seeds():
    s = over_seeds([56.0, 57.0, 58.5])
    assert s.mean == pytest.approx(171.5 / 3) and (s.n, s.low, s.high) == (3, 56.0, 58.5)
    assert s.std == pytest.approx(math.sqrt(((56 - 171.5 / 3) ** 2 + (57 - 171.5 / 3) ** 2 + (58.5 - 171.5 / 3) ** 2) / 2))
    assert s.std == pytest.approx(1.2583057392117916)
    one = over_seeds([52.4])
    assert (one.mean, one.std, one.n) == (52.4, None, 1)
    # per question, outcomes averaged over seeds; ids aligned whatever each file's order
    runs = [("s1", [{"id": "0", "rank": 1}, {"id": "1", "rank": None}, {"id": "2", "rank": 7}]),
            ("s2", [{"id": "2", "rank": 3}, {"id": "0", "rank": 2}, {"id": "1", "rank": 4}])]
    top5 = mean_outcomes(runs, "top-5")
    assert top5.ids == ("0", "1", "2") and top5.values.tolist() == [100.0, 50.0, 50.0] and top5.runs == 2
    assert mean_outcomes(runs, "top-1").values.tolist() == [50.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="different questions"):
        mean_outcomes([runs[0], ("s3", [{"id": "0", "rank": 1}])], "top-5")
