"""Claims about training recipes: the seed as a random effect.

Two trained systems differ by recipe *and* by the luck of their seeds. A test over questions alone
(`taser.evaluation.significance.paired_test` on seed-averaged outcomes) asks whether *these runs*
differ; it leaves out how much another set of seeds would move the difference. Here each run's
per-question outcomes enter a crossed question x seed model of the differences:

    paired by seed (both systems trained with seeds s = 1..S, same batch order):
        d_si = a_si - b_si = delta + u_s + v_i + e_si
    u_s: the seed's effect on the difference (recipe x seed), v_i: the question's, e_si: the rest.

A seed effect shared by both recipes (the batch order) cancels in d_si: the reason to pair by seed.
From the two-way ANOVA mean squares of the S x Q table of d (MS_seed, MS_question, MS_residual) the
variance components are estimated by the method of moments, each clipped at 0 (`_variance_and_df`):
sigma_u^2 = max(0, (MS_seed - MS_residual) / Q), sigma_v^2 = max(0, (MS_question - MS_residual) / S),
sigma_e^2 = MS_residual, and Var(mean d) = sigma_u^2 / S + sigma_v^2 / Q + sigma_e^2 / (S Q), with
Satterthwaite's degrees of freedom of the mean squares so combined (the seed mean square, the only
estimate of the seed's variance, always counted in them: see `_variance_and_df`); the two-sided
p-value comes from Student's t. No component is negative, so the variance is never below
MS_question / (S Q), the variance over questions alone of the seed-averaged differences: the
seed-aware test is never more confident than the one that ignores seeds.
A recipe against a seedless system (BM25, an untrained model: a fixed reference) is the same model on
d_si = a_si - fixed_i, whose seed term is the recipe's own seed variance (`against_fixed`). Seeds that
do not match (runs of different seed sets) take the unpaired variant: each system's own seed variance
over its own seeds, plus the questions'.

The interval is a two-level bootstrap (seeds with replacement, then questions with replacement;
paired: the same seeds and questions for both systems), and `detectable` gives the smallest
difference the design detects at the given power, `seeds_needed` how many matched seeds a
given difference needs at the observed variance components (none below `detectable_at_any_seeds`, the
floor the questions set). Where a test's seeds ran on more than one
machine, `machine_split` gives the difference on each and tests the machine x recipe interaction
(whether the difference changes with the machine more than seeds alone make it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

BATCH = 500


@dataclass(frozen=True)
class Components:
    """Variance components of the differences (per (seed, question) cell), from the ANOVA's mean squares."""

    seed: float  # sigma_u^2: the recipe x seed interaction (unpaired: both systems' seed variances, scaled to S)
    question: float  # sigma_v^2
    residual: float  # sigma_e^2
    seeds: int
    questions: int

    def variance(self, seeds: int | None = None) -> tuple[float, float]:
        """(Var(mean difference), Satterthwaite's df) with `seeds` matched seeds (default: the observed number)."""
        s, q = seeds or self.seeds, self.questions
        ms_seed = self.residual + q * self.seed
        ms_question = self.residual + s * self.question
        ms_residual = self.residual
        return _variance_and_df(ms_seed, ms_question, ms_residual, s, q)


def _variance_and_df(ms_seed: float, ms_question: float, ms_residual: float, s: int, q: int) -> tuple[float, float]:
    """(Var(mean d), its degrees of freedom) of an S x Q table of differences from its mean squares
    (seed, question, residual): the method of moments with each variance component clipped at 0.

    sigma_u^2 = max(0, (MS_seed - MS_residual) / Q), sigma_v^2 = max(0, (MS_question - MS_residual) / S),
    sigma_e^2 = MS_residual, and Var(mean d) = sigma_u^2 / S + sigma_v^2 / Q + sigma_e^2 / (S Q): the
    combination V = sum_k c_k MS_k / (S Q) of the mean squares actually used, c = (1, 1, -1) when no
    component is clipped, (0, 1, 0) when the seed's is (the question-only variance of the seed-averaged
    differences, MS_question / (S Q): V never falls below it), (1, 0, 0) when the question's is, (0, 0, 1)
    when both are. Its df is Satterthwaite's, (sum_k c_k MS_k)^2 / sum_k (c_k MS_k)^2 / df_k, with the
    seed mean square's term MS_seed^2 / (S - 1) in the denominator also where the seed component is
    clipped: that it is 0 is itself an estimate from S - 1 df (dropped, a null recipe at 3 seeds with the
    study's components is rejected 6.2-6.9% of the time at alpha 0.05; kept, 5.2-6.5%; at 5 seeds,
    4.9-5.7%: tests/test_recipes.py)."""
    c_seed = 1.0 if ms_seed > ms_residual else 0.0
    c_question = 1.0 if ms_question > ms_residual else 0.0
    used = [(c_question * ms_question, q - 1), ((1.0 - c_seed - c_question) * ms_residual, (s - 1) * (q - 1))]
    combined = c_seed * ms_seed + sum(term for term, _ in used)
    if combined <= 0:
        return 0.0, float((s - 1) * (q - 1))
    spread = ms_seed**2 / (s - 1) + sum(term**2 / k for term, k in used if term != 0)
    return combined / (s * q), float(combined**2 / spread)


@dataclass
class RecipeTest:
    delta: float  # mean over seeds and questions of system minus baseline (weighted over questions)
    se: float
    df: float
    p: float  # two-sided, Student's t with Satterthwaite's df
    design: str  # "paired by seed" or "unpaired"
    seeds: tuple  # the matched seeds (paired), or (mine, baseline's) counts (unpaired)
    components: Components | None = None  # paired only
    interval: tuple[float, float] | None = None
    extra: dict = field(default_factory=dict)
    by_machine: MachineSplit | None = None  # where the seeds ran on more than one machine (`machine_split`)

    @property
    def seed_count(self) -> int:
        """The seeds the test's seed term rests on: the matched seeds (paired), the recipe's against a
        seedless system, the fewer of the two systems' (unpaired)."""
        if self.design == "paired by seed":
            return len(self.seeds)
        return min(n for n in self.seeds if n > 1) if any(n > 1 for n in self.seeds) else 1

    def detectable(self, alpha: float = 0.05, power: float = 0.8) -> float:
        """The smallest |difference| this design detects with probability `power` at level `alpha` (two-sided)."""
        return detectable_difference(self.se, self.df, alpha, power)


def detectable_difference(se: float, df: float, alpha: float = 0.05, power: float = 0.8) -> float:
    """(t_{1 - alpha/2, df} + t_{power, df}) x se: the effect whose t-test rejects with probability about `power`."""
    from scipy.stats import t

    return float((t.ppf(1 - alpha / 2, df) + t.ppf(power, df)) * se)


def _weights(q: int, weights) -> np.ndarray:
    if weights is None:
        return np.full(q, 1.0 / q)
    w = np.asarray(weights, dtype=float)
    return w / w.sum()


def _anova(d: np.ndarray) -> tuple[float, float, float]:
    """Mean squares (seed, question, residual) of an S x Q table without replication."""
    s, q = d.shape
    grand = d.mean()
    rows, cols = d.mean(axis=1), d.mean(axis=0)
    ms_seed = q * np.sum((rows - grand) ** 2) / (s - 1)
    ms_question = s * np.sum((cols - grand) ** 2) / (q - 1)
    resid = d - rows[:, None] - cols[None, :] + grand
    ms_residual = np.sum(resid**2) / ((s - 1) * (q - 1))
    return float(ms_seed), float(ms_question), float(ms_residual)


def paired_by_seed(a: np.ndarray, b: np.ndarray, weights: Sequence[float] | None = None, seeds: Sequence = ()) -> RecipeTest:
    """The crossed question x seed test of a (S x Q) against b (S x Q), row s of both trained with seed s."""
    from scipy.stats import t

    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape or a.ndim != 2 or a.shape[0] < 2 or a.shape[1] < 2:
        raise ValueError(f"paired by seed needs two equal S x Q tables with S >= 2 seeds and Q >= 2 questions, got {a.shape} and {b.shape}")
    s, q = a.shape
    w = _weights(q, weights)
    d = (a - b) * (w * q)[None, :]  # weighted: the plain mean of d is the weighted figure's difference
    ms = _anova(d)
    variance, df = _variance_and_df(*ms, s, q)
    delta = float(d.mean())
    se = float(np.sqrt(variance))
    p = float(2 * t.sf(abs(delta) / se, df)) if se > 0 else (1.0 if delta == 0 else 0.0)
    ms_seed, ms_question, ms_residual = ms
    components = Components(max(0.0, (ms_seed - ms_residual) / q), max(0.0, (ms_question - ms_residual) / s), ms_residual, s, q)
    return RecipeTest(delta, se, df, min(1.0, p), "paired by seed", tuple(seeds), components)


def against_fixed(a: np.ndarray, fixed: np.ndarray, weights: Sequence[float] | None = None) -> RecipeTest:
    """A recipe's seeds a (S x Q) against a seedless system (BM25, an untrained model: one run, a
    fixed reference without seed variance of its own) on the same Q questions: the crossed model of
    `paired_by_seed` on d_si = a_si - fixed_i, whose seed term is the recipe's own seed variance, with
    the same estimator and Satterthwaite's df of the sum (not the seed term's S - 1 alone)."""
    a, fixed = np.asarray(a, dtype=float), np.asarray(fixed, dtype=float).reshape(-1)
    if a.ndim != 2 or a.shape[1] != fixed.shape[0]:
        raise ValueError(f"a recipe against a seedless system needs an S x Q table and Q outcomes, got {a.shape} and {fixed.shape}")
    test = paired_by_seed(a, np.broadcast_to(fixed, a.shape), weights)
    test.design, test.seeds = "unpaired, against a seedless system", (a.shape[0], 1)
    return test


def unpaired(a: np.ndarray, b: np.ndarray, weights: Sequence[float] | None = None) -> RecipeTest:
    """Systems whose seeds do not match: a (S_a x Q), b (S_b x Q) on the same questions. Var(difference)
    = each system's seed variance over its seeds + the questions' variance of the seed-averaged
    difference over Q; Welch-Satterthwaite's df."""
    from scipy.stats import t

    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1] or min(a.shape[0], b.shape[0]) < 1 or a.shape[1] < 2:
        raise ValueError(f"unpaired runs need S x Q tables on the same Q >= 2 questions, got {a.shape} and {b.shape}")
    q = a.shape[1]
    w = _weights(q, weights)
    terms, dfs = [], []
    for x in (a, b):
        if x.shape[0] >= 2:
            ms_seed, _, ms_residual = _anova(x * (w * q)[None, :])
            seed_var = max(0.0, (ms_seed - ms_residual) / q)  # the seed effect on this system's figure
            terms.append(seed_var / x.shape[0])
            dfs.append(x.shape[0] - 1)
    d = (a.mean(axis=0) - b.mean(axis=0)) * (w * q)
    terms.append(float(np.var(d, ddof=1)) / q)
    dfs.append(q - 1)
    variance = sum(terms)
    df = variance**2 / sum(term**2 / k for term, k in zip(terms, dfs) if term > 0) if variance > 0 else float(q - 1)
    delta = float(d.mean())
    se = float(np.sqrt(variance))
    p = float(2 * t.sf(abs(delta) / se, df)) if se > 0 else (1.0 if delta == 0 else 0.0)
    return RecipeTest(delta, se, float(df), min(1.0, p), "unpaired", (a.shape[0], b.shape[0]))


@dataclass(frozen=True)
class MachineSplit:
    """A recipe difference machine by machine: the seeds of a recipe test that ran on different
    machines (CPU kind, precision: `RunResult.machine`), and the test of the machine x recipe interaction."""

    deltas: tuple[tuple[str, float, tuple], ...]  # (machine, Δ over its seeds, its seeds), machines in their first seed's order
    f: float | None
    df: tuple[int, int]  # (machines - 1, seeds - machines)
    p: float | None  # None where no machine ran two seeds: nothing to measure the seeds' own spread against


def machine_split(a: np.ndarray, b: np.ndarray, machines: Sequence[str], seeds: Sequence, weights: Sequence[float] | None = None) -> MachineSplit:
    """The difference a - b (S x Q tables paired by seed; b may be a seedless system's outcomes
    repeated) on each machine, and whether it differs between machines beyond what seeds do.

    Each seed's mean difference D_s = mean_i d_si carries the question effects of the crossed model
    (`paired_by_seed`) for every seed alike, so between seeds D_s = delta + u_s + mean_i e_si varies by
    the recipe x seed effect and the residual only: iid across seeds when the machine does not change
    the difference. A one-way ANOVA of D_s by machine then gives F = MS_between / MS_within on
    (M - 1, S - M) df, exact under normality; the seeds within a machine are the test's only measure of
    the seeds' spread, so with one seed per machine there is no test (p None)."""
    from scipy.stats import f as f_dist

    a = np.asarray(a, dtype=float)
    b = np.broadcast_to(np.asarray(b, dtype=float), a.shape)
    if a.ndim != 2 or len(machines) != a.shape[0] or len(seeds) != a.shape[0]:
        raise ValueError(f"a machine split needs an S x Q table and one machine and seed per row, got {a.shape}, "
                         f"{len(machines)} machines and {len(seeds)} seeds")
    q = a.shape[1]
    per_seed = ((a - b) * (_weights(q, weights) * q)[None, :]).mean(axis=1)
    order = list(dict.fromkeys(machines))
    groups = [np.array([m == machine for m in machines]) for machine in order]
    deltas = tuple((machine, float(per_seed[g].mean()), tuple(s for s, keep in zip(seeds, g) if keep)) for machine, g in zip(order, groups))
    s, m = len(per_seed), len(order)
    df = (m - 1, s - m)
    if m < 2 or s - m < 1:
        return MachineSplit(deltas, None, df, None)
    grand = per_seed.mean()
    between = sum(g.sum() * (per_seed[g].mean() - grand) ** 2 for g in groups) / (m - 1)
    within = sum(float(np.sum((per_seed[g] - per_seed[g].mean()) ** 2)) for g in groups) / (s - m)
    if within == 0:
        return MachineSplit(deltas, None, df, 0.0 if between > 0 else 1.0)
    f = float(between / within)
    return MachineSplit(deltas, f, df, float(f_dist.sf(f, *df)))


def two_level_interval(a: np.ndarray, b: np.ndarray | None, weights=None, confidence: float = 0.95, resamples: int = 10_000, seed: int = 0,
                       paired: bool = True) -> tuple[float, float]:
    """The percentile interval of the difference (or of a's figure, b None) over seeds drawn with
    replacement, then questions drawn with replacement (paired: one draw of each for both systems)."""
    rng = np.random.default_rng(seed)
    a = np.asarray(a, dtype=float)
    q = a.shape[1]
    w = _weights(q, weights) * q
    if b is None:
        tables = [a * w]
    elif paired:
        tables = [(a - np.asarray(b, dtype=float)) * w]
    else:
        tables = [a * w, -np.asarray(b, dtype=float) * w]
    draws = np.empty(resamples)
    for start in range(0, resamples, BATCH):
        n = min(BATCH, resamples - start)
        questions = rng.integers(0, q, size=(n, q))
        total = np.zeros(n)
        for table in tables:
            s = table.shape[0]
            per_seed = table[:, questions].mean(axis=2)  # (S, n): each seed's figure on the drawn questions
            picked = rng.integers(0, s, size=(n, s))
            total += np.take_along_axis(per_seed.T, picked, axis=1).mean(axis=1)
        draws[start : start + n] = total
    low, high = np.quantile(draws, [(1 - confidence) / 2, (1 + confidence) / 2])
    return float(low), float(high)


def detectable_at_any_seeds(components: Components, alpha: float = 0.05, power: float = 0.8) -> float:
    """The smallest |difference| the recipe test detects at `power` however many matched seeds run, on
    these questions: Var(mean difference) falls to sigma_v^2 / Q as seeds grow (the questions on which the
    systems differ; df Q - 1), so a target below it needs more questions, not more seeds."""
    return detectable_difference(float(np.sqrt(components.question / components.questions)), components.questions - 1, alpha, power)


def seeds_needed(components: Components, difference: float, alpha: float = 0.05, power: float = 0.8, most: int = 200) -> int | None:
    """The fewest matched seeds whose design detects |difference| at `power` (at the observed
    variance components and number of questions); None when even `most` seeds do not."""
    for s in range(2, most + 1):
        variance, df = components.variance(s)
        if detectable_difference(float(np.sqrt(variance)), df, alpha, power) <= abs(difference):
            return s
    return None
