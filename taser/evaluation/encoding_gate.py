"""The accuracy gate of the encoding backends (`taser.models.backends`): may a backend stand in for
`torch`? Judged on per-question outcomes of the same questions under both (what it is run on, and
the verdicts: docs/encoding.md, "The accuracy gate").

A *check* is one model and one metric: on each question, torch's outcome and the backend's (top-k:
100 when the first passage holding an answer is within the first k, else 0; nDCG@10: the query's
value), and their difference d_i = backend - torch (a question where both agree contributes 0).
Per check:

- the mean difference and its percentile-bootstrap interval (`significance.bootstrap_interval`);
- p: the one-sided paired sign-flip test of a loss (`significance.sign_flip_test`, alternative
  "less": exact on top-k outcomes, random flips on nDCG), Holm-adjusted over the backend's checks
  (`significance.holm`; the family is one backend's checks, each backend judged on its own);
- the smallest detectable loss: the loss this test sees with probability `power` at the one-sided
  level alpha / m (Holm's first step over m checks, the level a lone loss must reach), the larger of
  - the churn seen: (z_{1 - alpha/m} + z_power) x the standard error of the mean difference;
  - the set's size: the exact test's smallest one-sided p on k differing questions is 2^-k, so a loss
    shows only once ceil(log2(m / alpha)) questions differ; a loss held by the fewest questions,
    each losing the metric's whole range (100 points of top-k, 1 of nDCG), reaches that many with
    probability `power` only from a loss of L, Binomial(n, L / range) >= that count. Where every
    question ties, the churn term is 0 and this one alone says what the set could have seen.

A check **fails** on a significant loss (Holm-adjusted p < alpha) or a mean loss at or beyond its
bound; else it is **undecided** when its smallest detectable loss exceeds the bound (the set could
not have seen a loss of the bound's size); else it **passes**. A backend passes when every check
passes, fails when any fails, and is otherwise undecided; `auto` takes only backends that passed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from taser.evaluation.significance import DEFAULT_RESAMPLES, bootstrap_interval, holm, sign_flip_test

# the largest mean loss a backend may have, in the metric's units (top-k: points of a percentage)
DEFAULT_BOUNDS: dict[str, float] = {"top-1": 0.5, "top-20": 0.5, "nDCG@10": 0.005}
PASSES, FAILS, UNDECIDED = "passes", "fails", "undecided"


def metric_range(metric: str) -> float:
    """The most one question can lose on `metric`: 100 points for top-k, 1 for a BEIR metric."""
    return 100.0 if metric.startswith("top-") else 1.0


@dataclass(frozen=True)
class GateSettings:
    alpha: float = 0.05  # one-sided, after Holm's correction over the backend's checks
    power: float = 0.8  # of the smallest detectable loss
    confidence: float = 0.95  # of the bootstrap interval of the mean difference
    resamples: int = DEFAULT_RESAMPLES  # of the random flips (nDCG) and of the bootstrap
    seed: int = 0  # of the resampling: a verdict is reproducible
    bounds: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_BOUNDS))

    def __post_init__(self):
        if not 0 < self.alpha < 1 or not 0 < self.power < 1 or not 0 < self.confidence < 1:
            raise ValueError(f"alpha, power and confidence must be in (0, 1), got {self.alpha}, {self.power}, {self.confidence}")

    def bound(self, metric: str) -> float:
        if metric not in self.bounds:
            raise ValueError(f"no bound for {metric!r}: the gate knows {sorted(self.bounds)} (GateSettings.bounds)")
        return float(self.bounds[metric])


def questions_needed_to_differ(checks: int, alpha: float) -> int:
    """The fewest differing questions whose exact one-sided sign-flip p (at best 2^-k) reaches alpha / checks."""
    level, k = alpha / checks, 0
    while 2.0**-k > level:
        k += 1
    return k


def size_floor(questions: int, metric: str, checks: int, alpha: float, power: float) -> float:
    """The smallest mean loss detectable on `questions` questions when the loss is held by the fewest
    questions (each losing the metric's whole range): the L with P(Binomial(n, L / range) >= k) = power,
    k = `questions_needed_to_differ`; infinite when the set has fewer than k questions."""
    from scipy.stats import binom

    k = questions_needed_to_differ(checks, alpha)
    if questions < k:
        return math.inf
    low, high = 0.0, 1.0  # the fraction of questions losing; binom.sf grows with it, and is 1 at 1
    for _ in range(60):
        mid = (low + high) / 2
        if binom.sf(k - 1, questions, mid) >= power:
            high = mid
        else:
            low = mid
    return high * metric_range(metric)


def churn_floor(differences: Sequence[float], checks: int, alpha: float, power: float) -> float:
    """(z_{1 - alpha/checks} + z_power) x the standard error of the mean difference over questions."""
    from scipy.stats import norm

    d = np.asarray(differences, dtype=float)
    if len(d) < 2:
        return math.inf
    se = float(np.std(d, ddof=1) / np.sqrt(len(d)))
    return float((norm.ppf(1 - alpha / checks) + norm.ppf(power)) * se)


def smallest_detectable_loss(differences: Sequence[float], metric: str, checks: int, alpha: float = 0.05, power: float = 0.8) -> float:
    """The loss the gate's test sees with probability `power` on this check (module docstring)."""
    return max(churn_floor(differences, checks, alpha, power), size_floor(len(differences), metric, checks, alpha, power))


@dataclass
class Check:
    model: str
    metric: str
    questions: int
    reference: float  # torch's figure
    figure: float  # the backend's
    difference: float  # figure - reference: below 0 a loss
    interval: tuple[float, float]  # bootstrap interval of the difference
    p: float  # one-sided, of a loss
    p_method: str  # "exact" or "Monte Carlo, N flips"
    bound: float
    detectable: float  # smallest detectable loss
    differing: int  # questions whose outcome differs
    p_holm: float = 1.0
    verdict: str = UNDECIDED
    why: str = ""

    @property
    def label(self) -> str:
        return f"{self.model} {self.metric}"


def _fmt(value: float, metric: str, sign: bool = False) -> str:
    if math.isinf(value):
        return "∞"
    spec = ("+" if sign else "") + (".2f" if metric.startswith("top-") else ".4f")
    return format(value, spec)


def fmt_p(p: float) -> str:
    """Two significant figures: 0.0039, 0.31, 1."""
    return f"{p:.2g}"


def _decide(check: Check, alpha: float) -> tuple[str, str]:
    loss = -check.difference
    unit = " point" if check.metric.startswith("top-") else ""
    if check.difference < 0 and check.p_holm < alpha:
        return FAILS, f"{check.label} significant loss {_fmt(loss, check.metric)}{unit} (Holm p {fmt_p(check.p_holm)})"
    if loss >= check.bound:
        return FAILS, f"{check.label} loss {_fmt(loss, check.metric)}{unit} >= bound {check.bound:g}"
    if check.detectable > check.bound:
        return UNDECIDED, (f"{check.label}: {check.questions} questions detect only losses >= {_fmt(check.detectable, check.metric)}{unit} "
                           f"(bound {check.bound:g})")
    return PASSES, ""


@dataclass
class Verdict:
    backend: str
    checks: list[Check]
    settings: GateSettings

    @property
    def outcome(self) -> str:
        verdicts = {c.verdict for c in self.checks}
        return FAILS if FAILS in verdicts else UNDECIDED if UNDECIDED in verdicts else PASSES

    def summary(self) -> str:
        """'passes', or 'fails: <the checks that failed>' / 'undecided: <the checks short of power>'."""
        outcome = self.outcome
        if outcome == PASSES:
            return PASSES
        return f"{outcome}: " + "; ".join(c.why for c in self.checks if c.verdict == outcome)

    def as_dict(self) -> dict:
        return {"backend": self.backend, "outcome": self.outcome, "summary": self.summary(),
                "checks": [{**{k: v for k, v in vars(c).items()}, "interval": list(c.interval)} for c in self.checks]}


def judge(backend: str, outcomes: Mapping[tuple[str, str], tuple[Sequence[float], Sequence[float]]],
          settings: GateSettings | None = None) -> Verdict:
    """The gate's verdict on `backend`: outcomes maps (model, metric) to (torch's per-question outcomes,
    the backend's), the same questions in the same order; every metric needs a bound in `settings`."""
    settings = settings or GateSettings()
    if not outcomes:
        raise ValueError("the gate needs at least one check")
    m = len(outcomes)
    checks = []
    for (model, metric), (reference, candidate) in outcomes.items():
        ref, got = np.asarray(reference, dtype=float), np.asarray(candidate, dtype=float)
        if ref.ndim != 1 or ref.shape != got.shape or not len(ref):
            raise ValueError(f"{model} {metric}: torch's and {backend}'s outcomes must be equal-length, non-empty 1-d sequences, "
                             f"got shapes {ref.shape} and {got.shape}")
        d = got - ref
        p, how = sign_flip_test(got, ref, resamples=settings.resamples, seed=settings.seed, alternative="less")
        checks.append(Check(
            model=model, metric=metric, questions=len(d), reference=float(ref.mean()), figure=float(got.mean()), difference=float(d.mean()),
            interval=bootstrap_interval(d, confidence=settings.confidence, resamples=settings.resamples, seed=settings.seed),
            p=p, p_method=how, bound=settings.bound(metric), detectable=smallest_detectable_loss(d, metric, m, settings.alpha, settings.power),
            differing=int(np.count_nonzero(d))))
    for check, adjusted in zip(checks, holm([c.p for c in checks])):
        check.p_holm = adjusted
        check.verdict, check.why = _decide(check, settings.alpha)
    return Verdict(backend, checks, settings)


def verdict_table(verdicts: Sequence[Verdict]) -> str:
    """One markdown row per check of every verdict, then each backend's outcome."""
    rows = ["| backend | model | metric | questions | differ | torch | backend | difference [interval] | p (one-sided) | p (Holm) | "
            "smallest detectable loss | bound | check |", "|---" * 13 + "|"]
    for v in verdicts:
        for c in v.checks:
            low, high = c.interval
            rows.append(f"| `{v.backend}` | {c.model} | {c.metric} | {c.questions} | {c.differing} | {_fmt(c.reference, c.metric)} | "
                        f"{_fmt(c.figure, c.metric)} | {_fmt(c.difference, c.metric, True)} [{_fmt(low, c.metric, True)}, "
                        f"{_fmt(high, c.metric, True)}] | {fmt_p(c.p)} | {fmt_p(c.p_holm)} | {_fmt(c.detectable, c.metric)} | "
                        f"{c.bound:g} | {c.verdict} |")
    outcomes = [f"- `{v.backend}` **{v.outcome}**" + ("" if v.outcome == PASSES else f": {v.summary().split(': ', 1)[1]}") for v in verdicts]
    return "\n".join(rows) + "\n\n" + "\n".join(outcomes) + "\n"


def describe(settings: GateSettings, checks: int) -> str:
    """The rule, with this run's numbers, for a results file."""
    bounds = ", ".join(f"{metric} {bound:g}" for metric, bound in settings.bounds.items())
    k = questions_needed_to_differ(checks, settings.alpha)
    return (f"Per check, d = backend - torch per question (a tie: 0); p: one-sided paired sign-flip test of a loss, Holm-adjusted "
            f"over the backend's {checks} checks; interval: {settings.confidence:.0%} percentile bootstrap of the mean difference. "
            f"A check fails on a significant loss (Holm p < {settings.alpha:g}) or a mean loss at or beyond its bound ({bounds}); "
            f"it is undecided when the smallest loss the test detects with {settings.power:.0%} power at one-sided "
            f"{settings.alpha:g}/{checks} exceeds the bound (the larger of (z + z_power) x the standard error of d, and the loss "
            f"that makes at least {k} questions lose their whole range with that power); else it passes.")
