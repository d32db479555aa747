"""Claims about recipes (`taser.evaluation.recipes`) and exact p-values (`significance.exact_sign_flip_p`):
the exact p equals a brute-force enumeration; on synthetic runs with a known recipe effect and a
known seed effect, the seed-aware test rejects at its level under the null while the test over
questions alone does not; the detectable difference matches a simulation of power."""

import itertools

import numpy as np
import pytest

from taser.evaluation.recipes import Components, detectable_difference, paired_by_seed, seeds_needed, two_level_interval, unpaired
from taser.evaluation.significance import exact_sign_flip_p, paired_test, sign_flip_test


def brute_force_p(d, w=None) -> float:
    d = np.asarray(d, dtype=float)
    w = np.full(len(d), 1 / len(d)) if w is None else np.asarray(w, dtype=float) / np.sum(w)
    observed = abs(np.sum(w * d))
    hits = sum(abs(np.sum(w * d * np.array(signs))) >= observed - 1e-12 for signs in itertools.product((-1, 1), repeat=len(d)))
    return hits / 2 ** len(d)


@pytest.mark.parametrize("case", range(12))
def test_the_exact_p_equals_a_brute_force_enumeration(case):
    rng = np.random.default_rng(case)
    n = int(rng.integers(3, 13))
    # per-question differences as the report meets them: 0/100 outcomes averaged over 1-3 seeds, some ties
    seeds = int(rng.integers(1, 4))
    d = rng.integers(-seeds, seeds + 1, size=n) * (100.0 / seeds)
    weights = rng.integers(1, 4, size=n).astype(float) if case % 3 == 0 else None  # unequal, rational weights (EntityQuestions)
    assert exact_sign_flip_p(d, weights) == pytest.approx(brute_force_p(d, weights), abs=1e-12)


def one_sided_brute_force_p(d, alternative: str) -> float:
    d = np.asarray(d, dtype=float)
    observed = np.mean(d)
    sums = [np.mean(d * np.array(signs)) for signs in itertools.product((-1, 1), repeat=len(d))]
    hits = sum(s <= observed + 1e-12 if alternative == "less" else s >= observed - 1e-12 for s in sums)
    return hits / 2 ** len(d)


@pytest.mark.parametrize("case", range(8))
@pytest.mark.parametrize("alternative", ["less", "greater"])
def test_the_one_sided_exact_p_equals_a_brute_force_enumeration(case, alternative):
    rng = np.random.default_rng(100 + case)
    d = rng.integers(-2, 3, size=int(rng.integers(3, 12))) * 50.0
    assert exact_sign_flip_p(d, alternative=alternative) == pytest.approx(one_sided_brute_force_p(d, alternative), abs=1e-12)


def test_one_sided_p_by_hand_and_in_monte_carlo():
    # 3 losses, no wins: only the observed signs reach a sum that low: 1/8; the other tail holds every sign: 1
    assert exact_sign_flip_p([-100.0] * 3, alternative="less") == 1 / 8
    assert exact_sign_flip_p([-100.0] * 3, alternative="greater") == 1.0
    assert exact_sign_flip_p([0.0] * 4, alternative="less") == 1.0
    a, b = np.array([1.0, np.pi, np.e, 2**0.5, 3**0.5]), np.zeros(5)  # no common unit: random flips; all 5 lower: 1 sign in 32
    p_less, how = sign_flip_test(b, a, resamples=4999, alternative="less")
    assert how == "Monte Carlo, 4999 flips" and p_less == pytest.approx(1 / 32, abs=0.01)
    with pytest.raises(ValueError, match="alternative"):
        exact_sign_flip_p([1.0], alternative="lower")


def test_exact_p_has_no_floor_and_falls_back_where_there_is_no_lattice():
    assert exact_sign_flip_p([100.0] * 60) == pytest.approx(2 / 2**60, rel=1e-9)  # far below any Monte Carlo floor
    assert exact_sign_flip_p([0.0] * 5) == 1.0
    assert exact_sign_flip_p([1.0, np.pi, np.e, 2**0.5]) is None  # no common unit: the caller resamples
    assert paired_test([1.0, np.pi, np.e, 2**0.5], [0.0] * 4, resamples=999) > 0


def _simulate(rng, seeds: int, questions: int, recipe: float, seed_sd: float, shared_seed_sd: float):
    """0/1 outcomes of two recipes on the same questions and seeds: each question's difficulty, a seed
    effect both recipes share (the batch order) and a recipe x seed effect (the seed's luck with
    this recipe), plus the recipe effect on the latent scale."""
    difficulty = rng.normal(0, 1.5, size=questions)
    shared = rng.normal(0, shared_seed_sd, size=seeds)[:, None]
    luck_a, luck_b = (rng.normal(0, seed_sd, size=seeds)[:, None] for _ in range(2))
    a = (difficulty + shared + luck_a + recipe + rng.normal(0, 1, size=(seeds, questions)) > 0).astype(float)
    b = (difficulty + shared + luck_b + rng.normal(0, 1, size=(seeds, questions)) > 0).astype(float)
    return 100 * a, 100 * b


def test_a_null_recipe_with_a_large_seed_effect_is_rejected_at_the_level_only_by_the_seed_aware_test():
    """Would catch a recipe test that leaves the seed out: over 300 draws of a null recipe effect
    with a large recipe x seed effect, the seed-aware test rejects about 5% of the time; the test
    over questions alone (seed-averaged outcomes) rejects far more often."""
    rng = np.random.default_rng(0)
    seed_aware = questions_only = 0
    draws = 300
    for _ in range(draws):
        a, b = _simulate(rng, seeds=3, questions=400, recipe=0.0, seed_sd=0.3, shared_seed_sd=0.5)
        seed_aware += paired_by_seed(a, b).p < 0.05
        questions_only += paired_test(a.mean(axis=0), b.mean(axis=0)) < 0.05
    assert seed_aware / draws <= 0.09  # about alpha (binomial sd at 300 draws: 1.3 points)
    assert questions_only / draws >= 0.4  # the seeds' luck read as a recipe effect


def test_the_detectable_difference_matches_a_simulation_of_power():
    """At the difference `detectable` reports, the test rejects about 80% of the time."""
    rng = np.random.default_rng(1)
    components = Components(seed=0.4, question=1.0, residual=25.0, seeds=4, questions=300)
    variance, df = components.variance()
    mdd = detectable_difference(float(np.sqrt(variance)), df)
    rejected, draws = 0, 400
    for _ in range(draws):
        d = (mdd + rng.normal(0, np.sqrt(components.seed), size=(4, 1)) + rng.normal(0, np.sqrt(components.question), size=(1, 300))
             + rng.normal(0, np.sqrt(components.residual), size=(4, 300)))
        rejected += paired_by_seed(d, np.zeros_like(d)).p < 0.05
    assert 0.72 <= rejected / draws <= 0.88
    assert seeds_needed(components, mdd) <= 4 and seeds_needed(components, mdd / 2) > 4  # half the difference needs more seeds
    assert seeds_needed(components, 1e-6) is None


def test_pairing_by_seed_removes_a_seed_effect_both_recipes_share():
    """A real recipe effect under a large shared seed effect: pairing keeps it visible, the unpaired
    test (which must count each system's seed variance) does not."""
    rng = np.random.default_rng(2)
    a, b = _simulate(rng, seeds=5, questions=800, recipe=0.25, seed_sd=0.02, shared_seed_sd=1.0)
    assert paired_by_seed(a, b).p < 0.01
    assert unpaired(a, b).p > paired_by_seed(a, b).p
    low, high = two_level_interval(a, b, resamples=2000)
    assert low < paired_by_seed(a, b).delta < high and low > 0


def test_weighted_questions_enter_the_recipe_difference():
    a = np.array([[100.0, 0.0, 0.0], [100.0, 0.0, 100.0]])
    b = np.zeros_like(a)
    assert paired_by_seed(a, b).delta == pytest.approx(50.0)
    assert paired_by_seed(a, b, weights=[2, 1, 1]).delta == pytest.approx((2 * 100 + 0 + 50) / 4)
    with pytest.raises(ValueError, match="S >= 2 seeds"):
        paired_by_seed(a[:1], b[:1])
