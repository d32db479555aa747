"""The recipe test's figures against hand computations and a plain re-derivation (issue 46, mutation
testing of `taser/evaluation/recipes.py`): the ANOVA's mean squares and the clipped variance by hand;
the unpaired test, the machine split and the two-level interval recomputed by explicit loops; the
degenerate cases (no spread at all, one seed a machine, a seedless system given as a 1 x Q table);
the refusals; and the defaults of `detectable` and `seeds_needed`."""

import warnings

import numpy as np
import pytest
from scipy.stats import f as f_dist
from scipy.stats import t as t_dist

from taser.evaluation.recipes import (
    BATCH,
    Components,
    _anova,
    _variance_and_df,
    against_fixed,
    detectable_difference,
    machine_split,
    paired_by_seed,
    seeds_needed,
    two_level_interval,
    unpaired,
)


def test_the_anovas_mean_squares_by_hand():
    """d = [[1, 2, 3], [2, 2, 5]]: grand 2.5, rows (2, 3), columns (1.5, 2, 4); residuals
    (0, .5, -.5 / 0, -.5, .5): MS_seed = 3 x 0.5 / 1, MS_question = 2 x 3.5 / 2, MS_residual = 1 / 2."""
    assert _anova(np.array([[1.0, 2, 3], [2, 2, 5]])) == pytest.approx((1.5, 3.5, 0.5))


@pytest.mark.parametrize("ms, expected", [
    ((4.0, 3.0, 1.0), (6 / 30, 36 / (16 / 2 + 9 / 9 + 1 / 18))),  # nothing clipped: MS_s + MS_q - MS_e
    ((1.0, 3.0, 1.0), (3 / 30, 9 / (1 / 2 + 9 / 9))),  # MS_seed = MS_residual: the seed's component is 0 (clipped)
    ((3.0, 1.0, 1.0), (3 / 30, 9 / (9 / 2))),  # MS_question = MS_residual: the question's is 0
    ((2.0, 1.0, 0.5), (2.5 / 30, 2.5**2 / (4 / 2 + 1 / 9 + 0.25 / 18))),  # a term of exactly 1 stays in the df
    ((0.0, 0.0, 0.0), (0.0, 18.0)),  # no spread at all: variance 0 on the residual's df
])
def test_the_clipped_variance_and_its_df_by_hand(ms, expected):
    """Would catch a component clipped at >= instead of >, a wrong residual df, or the no-spread case
    given other df (S = 3 seeds, Q = 10 questions: residual df 18)."""
    assert _variance_and_df(*ms, 3, 10) == pytest.approx(expected)


def _rng_tables(seed, shapes):
    rng = np.random.default_rng(seed)
    return [rng.binomial(1, rng.uniform(0.3, 0.7, size=shape[1]), size=shape).astype(float) for shape in shapes]


def _reference_unpaired(a, b, weights):
    """The unpaired test, written out: each system's seed variance of its weighted figure, plus the
    questions' variance of the seed-averaged difference; Welch-Satterthwaite's df."""
    q = a.shape[1]
    w = np.asarray(weights, dtype=float) / np.sum(weights) * q
    terms, dfs = [], []
    for x in (a, b):
        seeds = x.shape[0]
        if seeds < 2:
            continue
        y = x * w
        grand, rows, cols = y.mean(), y.mean(axis=1), y.mean(axis=0)
        ms_seed = q * sum((r - grand) ** 2 for r in rows) / (seeds - 1)
        ms_residual = sum((y[i, j] - rows[i] - cols[j] + grand) ** 2 for i in range(seeds) for j in range(q)) / ((seeds - 1) * (q - 1))
        terms.append(max(0.0, (ms_seed - ms_residual) / q) / seeds)
        dfs.append(seeds - 1)
    d = [(a[:, j].mean() - b[:, j].mean()) * w[j] for j in range(q)]
    mean = sum(d) / q
    terms.append(sum((x - mean) ** 2 for x in d) / (q - 1) / q)
    dfs.append(q - 1)
    variance = sum(terms)
    df = variance**2 / sum(term**2 / k for term, k in zip(terms, dfs) if term > 0)
    return mean, variance**0.5, df, 2 * t_dist.sf(abs(mean) / variance**0.5, df)


@pytest.mark.parametrize("seeds_a, seeds_b", [(3, 2), (2, 4), (3, 1)])
def test_the_unpaired_test_equals_its_written_out_form(seeds_a, seeds_b):
    """Would catch any slip in the unpaired variant (runs whose seeds do not match): its seed terms,
    which systems have one (two seeds or more), its weights, its df and p, and what it records."""
    a, b = _rng_tables(seeds_a * 10 + seeds_b, [(seeds_a, 40), (seeds_b, 40)])
    a[:, :10] = 1.0  # a real difference on a quarter of the questions
    weights = np.linspace(1, 3, 40)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a one-run system has no seed term to compute (0/0 would warn in every report)
        test = unpaired(a, b, weights)
    delta, se, df, p = _reference_unpaired(a, b, weights)
    assert (test.delta, test.se, test.df, test.p) == pytest.approx((delta, se, df, p), rel=1e-9)
    assert (test.design, test.seeds, test.seed_count) == ("unpaired", (seeds_a, seeds_b), min(n for n in (seeds_a, seeds_b) if n > 1))
    assert test.detectable() == pytest.approx(detectable_difference(se, df))


def test_tables_without_any_spread_give_p_one_or_zero():
    """Would catch the no-spread case (se 0) of either test given another p, or a crash there."""
    ones, zeros = np.ones((3, 5)), np.zeros((3, 5))
    for test in (unpaired(ones, ones), paired_by_seed(ones, ones)):
        assert (test.delta, test.se, test.p) == (0.0, 0.0, 1.0)
    for test in (unpaired(ones, zeros), paired_by_seed(ones, zeros)):
        assert (test.delta, test.se, test.p) == (1.0, 0.0, 0.0)
    assert unpaired(ones, zeros).df == 4.0  # the questions' df where nothing varies


def test_the_paired_components_and_p_equal_their_written_out_form():
    """Would catch a wrong variance component (each clipped at 0, on the right scale) or seed count."""
    a, b = _rng_tables(7, [(4, 30), (4, 30)])
    a[1] = np.clip(a[1] + 0.5, 0, 1)  # one seed of the recipe better than the others: a seed component
    test = paired_by_seed(a, b, seeds=(1, 2, 3, 4))
    ms_seed, ms_question, ms_residual = _anova(a - b)
    expected = Components(max(0.0, (ms_seed - ms_residual) / 30), max(0.0, (ms_question - ms_residual) / 4), ms_residual, 4, 30)
    assert test.components == pytest.approx(expected) and (test.components.seeds, test.components.questions) == (4, 30)
    assert test.components.seed > 0 and test.components.question > 0
    variance, df = _variance_and_df(ms_seed, ms_question, ms_residual, 4, 30)
    assert (test.se, test.df, test.p) == pytest.approx((variance**0.5, df, 2 * t_dist.sf(abs(test.delta) / variance**0.5, df)))
    assert test.detectable(0.01, 0.9) == pytest.approx(detectable_difference(test.se, test.df, 0.01, 0.9))
    assert test.detectable() == pytest.approx(detectable_difference(test.se, test.df, 0.05, 0.8))


def test_the_tests_refuse_tables_they_cannot_test():
    """Would catch a table of the wrong shape let through (to a wrong figure or an obscure numpy error)."""
    with pytest.raises(ValueError, match=r"two equal S x Q tables .* got \(3, 4\) and \(3, 5\)"):
        paired_by_seed(np.ones((3, 4)), np.ones((3, 5)))
    with pytest.raises(ValueError, match="S >= 2 seeds and Q >= 2 questions"):
        paired_by_seed(np.ones((3, 1)), np.ones((3, 1)))
    assert paired_by_seed(np.eye(2), np.zeros((2, 2))).components.questions == 2  # two questions are enough
    for a, b in ((np.ones(4), np.ones((2, 4))), (np.ones((2, 4)), np.ones(4)), (np.ones((2, 4)), np.ones((2, 5))),
                 (np.ones((0, 4)), np.ones((2, 4))), (np.ones((2, 4)), np.ones((0, 4))), (np.ones((2, 1)), np.ones((2, 1)))):
        with pytest.raises(ValueError, match=r"unpaired runs need S x Q tables on the same Q >= 2 questions, got"):
            unpaired(a, b)
    assert unpaired(np.eye(2), np.zeros((1, 2))).seeds == (2, 1)  # one run of the baseline, two questions: enough
    with pytest.raises(ValueError, match=r"a recipe against a seedless system needs an S x Q table and Q outcomes, got \(4,\)"):
        against_fixed(np.ones(4), np.ones(4))
    with pytest.raises(ValueError, match=r"got \(2, 4\) and \(5,\)"):
        against_fixed(np.ones((2, 4)), np.ones(5))


def test_a_seedless_system_may_come_as_its_one_run_and_its_weights_count():
    """Would catch the seedless system's 1 x Q table (one run, as reports hold it) refused, or the
    weights not passed on."""
    a, fixed = _rng_tables(3, [(3, 20), (1, 20)])
    weights = np.arange(1, 21)
    test = against_fixed(a, fixed, weights)
    same = paired_by_seed(a, np.broadcast_to(fixed.reshape(-1), a.shape), weights)
    assert (test.delta, test.se, test.df, test.p) == (same.delta, same.se, same.df, same.p)
    assert test.delta != against_fixed(a, fixed).delta and (test.design, test.seeds) == ("unpaired, against a seedless system", (3, 1))


def _reference_split(a, b, machines):
    per_seed = [float(np.mean(a[i] - b[i])) for i in range(len(machines))]
    names = list(dict.fromkeys(machines))
    groups = {m: [x for x, n in zip(per_seed, machines) if n == m] for m in names}
    grand = sum(per_seed) / len(per_seed)
    between = sum(len(g) * (np.mean(g) - grand) ** 2 for g in groups.values()) / (len(names) - 1)
    within = sum(sum((x - np.mean(g)) ** 2 for x in g) for g in groups.values()) / (len(per_seed) - len(names))
    return [(m, np.mean(g)) for m, g in groups.items()], between / within


def test_the_machine_split_over_three_machines_equals_its_written_out_form():
    """Would catch the difference taken as a sum, the between-machine mean square not divided by its
    df (invisible with two machines), or one seed more per machine asked for than the test needs."""
    a, b = _rng_tables(11, [(5, 30), (5, 30)])
    machines = ["A", "B", "A", "C", "B"]  # five seeds, three machines: 2 df within
    split = machine_split(a, b, machines, seeds=[1, 2, 3, 4, 5])
    deltas, f = _reference_split(a, b, machines)
    assert [m for m, _, _ in split.deltas] == [m for m, _ in deltas] == ["A", "B", "C"]
    assert [d for _, d, _ in split.deltas] == pytest.approx([d for _, d in deltas]) and [s for _, _, s in split.deltas] == [(1, 3), (2, 5), (4,)]
    assert split.df == (2, 2) and (split.f, split.p) == pytest.approx((f, f_dist.sf(f, 2, 2)))
    one_extra = machine_split(a[:3], b[:3], machines[:3], seeds=[1, 2, 3])  # two machines, three seeds: 1 df within
    assert one_extra.df == (1, 1) and one_extra.p is not None


def test_a_machine_split_whose_seeds_agree_within_each_machine():
    """Would catch the within-machine spread of 0 (seeds that agree exactly on each machine) given a
    wrong verdict: any between-machine difference is then certain (p 0), none is p 1."""
    a = np.array([[1.0, 0], [1, 0], [0, 0], [0, 0]])
    split = machine_split(a, np.zeros((4, 2)), ["x", "x", "y", "y"], seeds=[1, 2, 3, 4])
    assert (split.deltas, split.f, split.df, split.p) == ((("x", 0.5, (1, 2)), ("y", 0.0, (3, 4))), None, (1, 2), 0.0)
    same = machine_split(np.ones((4, 2)), np.zeros((4, 2)), ["x", "x", "y", "y"], seeds=[1, 2, 3, 4])
    assert (same.f, same.df, same.p) == (None, (1, 2), 1.0)
    alone = machine_split(np.ones((2, 2)), np.zeros((2, 2)), ["x", "y"], seeds=[1, 2])
    assert (alone.f, alone.df, alone.p) == (None, (1, 0), None)


def _reference_interval(a, b, weights, confidence, resamples, seed, paired):
    """The two-level bootstrap written out, drawing from the generator in the same order."""
    rng = np.random.default_rng(seed)
    q = a.shape[1]
    w = np.asarray(weights, dtype=float) / np.sum(weights) * q
    tables = [a * w] if b is None else [(a - b) * w] if paired else [a * w, -b * w]
    draws = []
    for start in range(0, resamples, BATCH):
        n = min(BATCH, resamples - start)
        questions = rng.integers(0, q, size=(n, q))
        total = np.zeros(n)
        for table in tables:
            per_seed = np.array([[table[s, questions[k]].mean() for k in range(n)] for s in range(table.shape[0])])
            picked = rng.integers(0, table.shape[0], size=(n, table.shape[0]))
            total += np.array([per_seed[picked[k], k].mean() for k in range(n)])
        draws.extend(total)
    return tuple(np.quantile(draws, [(1 - confidence) / 2, (1 + confidence) / 2]))


@pytest.mark.parametrize("b_kind", ["none", "paired", "unpaired"])
def test_the_two_level_interval_equals_its_written_out_form(b_kind):
    """Would catch a slip in the bootstrap: its weights, the sign of the baseline, the questions or
    seeds drawn, a batch left out or cut (resamples not a multiple of the batch), the quantiles."""
    a, b = _rng_tables(5, [(3, 12), (3, 12)])
    weights = np.arange(1, 13)
    base = None if b_kind == "none" else b
    got = two_level_interval(a, base, weights, confidence=0.9, resamples=BATCH + 250, seed=4, paired=b_kind != "unpaired")
    assert got == pytest.approx(_reference_interval(a, base, weights, 0.9, BATCH + 250, 4, b_kind != "unpaired"))


def test_seeds_needed_is_the_first_count_that_detects_the_difference():
    """Would catch a search that starts above 2 seeds, stops before `most`, or goes past it, or drops
    the power it was given."""
    components = Components(seed=0.0004, question=0.02, residual=0.2, seeds=3, questions=500)

    def detects(s, difference, power=0.8):
        variance, df = components.variance(s)
        return detectable_difference(variance**0.5, df, 0.05, power) <= difference

    assert seeds_needed(components, 1.0) == 2 and detects(2, 1.0)  # a large difference: two seeds are enough
    needed = next(s for s in range(2, 200) if detects(s, 0.03))
    assert needed > 3 and seeds_needed(components, 0.03) == needed == seeds_needed(components, -0.03)
    assert seeds_needed(components, 0.03, most=needed) == needed and seeds_needed(components, 0.03, most=needed - 1) is None
    stricter = next(s for s in range(2, 200) if detects(s, 0.03, power=0.95))
    assert stricter > needed and seeds_needed(components, 0.03, power=0.95) == stricter
