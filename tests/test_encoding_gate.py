"""The encoding backends' accuracy gate (`taser.evaluation.encoding_gate`): it fails a backend that
loses (significantly, or beyond the bound), calls a set too small or too noisy to see the bound
undecided, and passes `onnx` against `torch` on real encodings of the SQuAD protocol's questions;
a backend adding Gaussian noise to torch's vectors fails on the same questions."""

import math

import numpy as np
import pytest
from conftest import SQUAD, tiny_model_cfg
from scipy.stats import binom

from taser.evaluation.encoding_gate import (
    FAILS,
    PASSES,
    UNDECIDED,
    GateSettings,
    judge,
    questions_needed_to_differ,
    size_floor,
    smallest_detectable_loss,
    verdict_table,
)
from taser.evaluation.ir_metrics import per_query_metrics
from taser.models.backends import onnx_available


def hits(n: int, on: int) -> np.ndarray:
    """Top-k outcomes (0 / 100) of n questions, the first `on` of them hits."""
    return np.where(np.arange(n) < on, 100.0, 0.0)


def test_a_loss_on_whole_questions_fails_with_the_exact_p():
    torch_ = hits(2000, 1000)
    lost = torch_.copy()
    lost[:9] = 0.0  # 9 questions lost, none won: -0.45 point, under the 0.5 bound
    verdict = judge("lossy", {("dpr", "top-1"): (torch_, lost), ("dpr", "top-20"): (torch_, torch_)})
    check, tied = verdict.checks
    assert check.difference == pytest.approx(-0.45) and check.differing == 9
    assert check.p == pytest.approx(2.0**-9, rel=1e-12)  # only the observed signs reach a sum that low
    assert check.p_holm == pytest.approx(2 * 2.0**-9, rel=1e-12)  # Holm: the smaller of 2 p-values times 2
    assert tied.p == 1.0 and tied.p_holm == 1.0 and tied.interval == (0.0, 0.0) and tied.verdict == PASSES
    assert check.interval[0] < -0.45 < check.interval[1] < 0
    assert check.verdict == FAILS and verdict.outcome == FAILS
    assert verdict.summary() == "fails: dpr top-1 significant loss 0.45 point (Holm p 0.0039)"


def test_a_loss_at_the_bound_fails_even_when_not_significant():
    torch_ = hits(2000, 1000)
    churned = torch_.copy()
    churned[:60] = 0.0  # 60 hits lost
    churned[1000:1050] = 100.0  # 50 won: -0.5 point
    check = judge("churn", {("dpr", "top-20"): (torch_, churned)}).checks[0]
    assert check.difference == pytest.approx(-0.5)
    assert check.p == pytest.approx(binom.cdf(50, 110, 0.5), rel=1e-9)  # 110 signs; at most 50 of them gains
    assert check.p > 0.05 and check.verdict == FAILS and "loss 0.50 point >= bound 0.5" in check.why


def test_too_few_questions_are_undecided_not_passed():
    same, ndcg = hits(6, 3), np.full(6, 0.8)
    # 2 checks: one-sided 0.025 needs 6 questions to differ, so all 6 must lose: P(all 6) = 0.8 at a loss of 0.8^(1/6) of the range
    verdict = judge("tiny", {("dpr", "top-20"): (same, same), ("dpr", "nDCG@10"): (ndcg, ndcg)})
    assert [c.detectable for c in verdict.checks] == pytest.approx([100 * 0.8 ** (1 / 6), 0.8 ** (1 / 6)], rel=1e-9)
    assert verdict.outcome == UNDECIDED and all(c.p == 1.0 and c.difference == 0.0 for c in verdict.checks)
    # the gate's 6 checks (2 models x top-1, top-20, nDCG@10): 7 must differ, more than the set holds
    six = {(model, metric): (ndcg, ndcg) if metric == "nDCG@10" else (same, same)
           for model in ("dpr", "taser") for metric in ("top-1", "top-20", "nDCG@10")}
    verdict = judge("tiny", six)
    assert verdict.outcome == UNDECIDED and all(math.isinf(c.detectable) for c in verdict.checks)
    assert "dpr nDCG@10: 6 questions detect only losses >= ∞ (bound 0.005)" in verdict.summary()
    # all ties on 1,000 questions: a 0.5-point loss would flip 5 questions on average, and Holm's first step over 2 checks
    # (one-sided 0.025) needs 6 to differ (2^-6 <= 0.025 < 2^-5): undecided; on 2,000 it passes
    for n, outcome in ((1000, UNDECIDED), (2000, PASSES)):
        same = hits(n, n // 2)
        assert judge("exact", {("dpr", "top-1"): (same, same), ("dpr", "top-20"): (same, same)}).outcome == outcome, n


def test_churn_without_a_mean_loss_is_undecided():
    torch_ = hits(2000, 1000)
    churned = torch_.copy()
    churned[:40] = 0.0
    churned[1000:1040] = 100.0  # 40 lost, 40 won: no loss on average, but the test could not see one of 0.5 point
    check = judge("churn", {("dpr", "top-1"): (torch_, churned)}).checks[0]
    assert check.difference == 0.0 and check.p > 0.5
    assert check.detectable > 0.5 and check.verdict == UNDECIDED


def test_the_size_floor_by_hand():
    assert questions_needed_to_differ(1, 0.05) == 5  # 2^-5 = 0.031 <= 0.05 < 2^-4
    assert questions_needed_to_differ(6, 0.05) == 7  # 0.05 / 6 = 0.0083: 2^-7 = 0.0078
    assert size_floor(6, "top-1", 6, 0.05, 0.8) == math.inf
    loss = size_floor(1971, "top-20", 6, 0.05, 0.8)
    assert binom.sf(6, 1971, loss / 100) == pytest.approx(0.8, abs=1e-6)  # at least 7 of 1,971 questions lose, with 80%
    assert size_floor(1971, "nDCG@10", 6, 0.05, 0.8) == pytest.approx(loss / 100)  # one query loses at most 1 of nDCG
    assert 0.45 < loss < 0.5  # the SQuAD protocol's 1,971 questions can see the 0.5-point bound
    # ties only: the set's size decides; churn: the standard error does
    assert smallest_detectable_loss(np.zeros(1971), "top-1", 6) == pytest.approx(loss)
    assert smallest_detectable_loss(np.r_[np.full(50, 100.0), np.full(50, -100.0), np.zeros(1871)], "top-1", 6) > 1.0


def test_settings_are_checked():
    with pytest.raises(ValueError, match="no bound for 'MRR@10'"):
        judge("x", {("dpr", "MRR@10"): ([0.5, 0.5], [0.5, 0.5])})
    with pytest.raises(ValueError, match="equal-length"):
        judge("x", {("dpr", "top-1"): ([100.0, 0.0], [100.0])})
    with pytest.raises(ValueError, match="alpha"):
        GateSettings(alpha=0)


# -- real encodings: the SQuAD protocol's evaluation questions, with a tiny random encoder ------------


@pytest.fixture(scope="module")
def protocol_vectors(tmp_path_factory, tiny_pretrained):
    """Torch's and onnx's vectors of the protocol's 1,953 evaluation questions with a gold passage and
    of their articles' passages (a smaller corpus than the protocol's 2,141: a faster test)."""
    if not onnx_available():
        pytest.skip("the onnx extra is not installed")
    from taser.data.squad import load_squad
    from taser.models.encoding import encode_passages, encode_questions
    from taser.models.loading import load_checkpoint, load_model

    corpus, articles = load_squad(SQUAD)
    dev = articles[30:]  # the protocol's evaluation articles
    passages = [corpus[i] for a in dev for i in a.passage_ids]
    row = {int(p.id) - 1: j for j, p in enumerate(passages)}
    questions = [q for a in dev for q in a.questions if q.positive is not None]
    model, tokenizer = load_model(tiny_model_cfg(tiny_pretrained, "shared", pooling="mean", normalize=True))
    path = tmp_path_factory.mktemp("gate") / "shared"
    model.save(path, tokenizer)
    vectors = {}
    for backend in ("torch", "onnx"):
        encoder, tok = load_checkpoint(path, "cpu", backend=backend)
        if backend == "torch":
            encoder.eval()
        kw = {"batch_size": 128, "precision": "fp32"}
        vectors[backend] = (encode_questions(encoder, tok, [q.question for q in questions], **kw), encode_passages(encoder, tok, passages, **kw))
    gold = np.array([row[q.positive] for q in questions])
    return vectors, gold


def outcomes(q: np.ndarray, p: np.ndarray, gold: np.ndarray) -> dict[str, np.ndarray]:
    """Per question: top-1 and top-20 (the gold passage within the first k: 100, else 0) and nDCG@10 (pytrec_eval)."""
    scores = q @ p.T
    rank = (scores > scores[np.arange(len(gold)), gold][:, None]).sum(axis=1) + 1
    top = np.argsort(-scores, axis=1, kind="stable")[:, :10]
    run = {str(i): [(str(j), float(scores[i, j])) for j in row] for i, row in enumerate(top)}
    ndcg = per_query_metrics(run, {str(i): {str(g): 1} for i, g in enumerate(gold)}, ks=(10,))
    return {"top-1": 100.0 * (rank <= 1), "top-20": 100.0 * (rank <= 20), "nDCG@10": np.array([ndcg[str(i)]["nDCG@10"] for i in range(len(gold))])}


def gate_on(vectors_a, vectors_b, gold, name, settings=None):
    a, b = outcomes(*vectors_a, gold), outcomes(*vectors_b, gold)
    return judge(name, {("shared", metric): (a[metric], b[metric]) for metric in a}, settings)


def test_onnx_passes_against_torch(protocol_vectors):
    vectors, gold = protocol_vectors
    verdict = gate_on(vectors["torch"], vectors["onnx"], gold, "onnx")
    assert verdict.outcome == PASSES, verdict_table([verdict])
    assert len(gold) == 1953 and all(c.questions == 1953 for c in verdict.checks)
    assert outcomes(*vectors["torch"], gold)["top-20"].mean() > 5  # not a set where both find nothing


NOISE = 0.01  # standard deviation per coordinate, on unit vectors of 64 dimensions (a noise vector of norm ~0.08)


def test_a_backend_adding_noise_to_torchs_vectors_fails(protocol_vectors):
    vectors, gold = protocol_vectors
    rng = np.random.default_rng(0)
    q, p = vectors["torch"]
    noisy = (q + rng.normal(0.0, NOISE, q.shape).astype(np.float32), p + rng.normal(0.0, NOISE, p.shape).astype(np.float32))
    verdict = gate_on(vectors["torch"], noisy, gold, "noisy", GateSettings(resamples=2000))  # fewer random flips (nDCG): a faster test
    assert verdict.outcome == FAILS, verdict_table([verdict])
    top20 = next(c for c in verdict.checks if c.metric == "top-20")
    assert top20.difference < -1 and top20.p_holm < 1e-6 and top20.verdict == FAILS
    assert "verdict" not in verdict_table([verdict]) and "`noisy` **fails**" in verdict_table([verdict])


def test_the_churn_floor_is_at_alpha_over_the_number_of_checks():
    """Would catch the churn term at the one-sided level alpha instead of alpha / m (Holm's first step
    over m checks): 7 questions lost and 7 won of 2,000 give a standard error of sqrt(14 / 1999) x 100
    / sqrt(2000); over 2 checks the loss seen with 80% power is (z_0.9875 + z_0.8) x that = 0.524
    point, above the 0.5 bound: undecided (at alpha alone, 0.465: it would pass)."""
    from scipy.stats import norm

    torch_ = hits(2000, 1000)
    churned = torch_.copy()
    churned[:7] = 0.0
    churned[1000:1007] = 100.0
    se = np.sqrt(14 / 1999) * 100 / np.sqrt(2000)
    verdict = judge("churn", {("dpr", "top-1"): (torch_, churned), ("dpr", "top-20"): (torch_, torch_)})
    check = verdict.checks[0]
    assert check.difference == 0.0 and check.differing == 14
    assert check.detectable == pytest.approx((norm.ppf(1 - 0.05 / 2) + norm.ppf(0.8)) * se, rel=1e-9)
    assert check.detectable > 0.5 > (norm.ppf(1 - 0.05) + norm.ppf(0.8)) * se  # the bound sits between the two levels
    assert check.verdict == UNDECIDED and verdict.outcome == UNDECIDED
    assert "dpr top-1: 2000 questions detect only losses >= 0.52 point (bound 0.5)" in verdict.summary()
    # over 4 checks the level is 0.05 / 4: z_0.9875 becomes z_0.99375
    assert smallest_detectable_loss(churned - torch_, "top-1", 4) == pytest.approx((norm.ppf(1 - 0.05 / 4) + norm.ppf(0.8)) * se, rel=1e-9)
