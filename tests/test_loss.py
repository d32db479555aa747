"""The contrastive NLL against hand-computed values, for each similarity and mode."""

import math

import pytest
import torch

from taser.training.loss import LossConfig, retrieval_loss

# two questions, each with its positive then one hard negative: ctx = [p0, n0, p1, n1]
Q = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
CTX = torch.tensor([[2.0, 0.0], [0.0, 1.0], [0.0, 3.0], [1.0, 1.0]])
POS = torch.tensor([0, 2])
OWNER = torch.tensor([0, 0, 1, 1])
e = math.exp


def nll(scores, target):
    return math.log(sum(e(s) for s in scores)) - scores[target]


@pytest.mark.parametrize(
    "similarity, temperature, in_batch, expected",
    [
        ("dot", 1.0, True, [nll([2, 0, 0, 1], 0), nll([0, 1, 3, 1], 2)]),
        ("dot", 1.0, False, [nll([2, 0], 0), nll([3, 1], 0)]),
        ("cosine", 0.5, True, [nll([2, 0, 0, math.sqrt(2)], 0), nll([0, 2, 2, math.sqrt(2)], 2)]),
        ("cosine", 0.5, False, [nll([2, 0], 0), nll([2, math.sqrt(2)], 0)]),
        ("l2", 1.0, True, [nll([-1, -2, -10, -1], 0), nll([-5, 0, -4, -1], 2)]),
        ("l2", 2.0, False, [nll([-0.5, -1], 0), nll([-2, -0.5], 0)]),
    ],
)
def test_loss_matches_hand_computed(similarity, temperature, in_batch, expected):
    loss, correct = retrieval_loss(Q, CTX, POS, OWNER, LossConfig(similarity, temperature, in_batch))
    assert loss.tolist() == pytest.approx(expected, rel=1e-6)


def test_correct_counts_argmax():
    _, correct = retrieval_loss(Q, CTX, POS, OWNER, LossConfig("dot"))
    assert correct.tolist() == [True, True]
    _, correct = retrieval_loss(Q, CTX, torch.tensor([1, 2]), OWNER, LossConfig("dot"))
    assert correct.tolist() == [False, True]


def test_uneven_negative_counts():
    # question 0 has no negative left (ctx = [p0, p1, n1])
    ctx = CTX[[0, 2, 3]]
    loss, _ = retrieval_loss(Q, ctx, torch.tensor([0, 1]), torch.tensor([0, 1, 1]), LossConfig("dot", in_batch=False))
    assert loss.tolist() == pytest.approx([0.0, nll([3, 1], 0)], abs=1e-6)


def test_bad_config():
    with pytest.raises(ValueError, match="similarity"):
        LossConfig("manhattan")
    with pytest.raises(ValueError, match="temperature"):
        LossConfig("dot", 0.0)


def test_auto_temperature_follows_the_vectors():
    from taser.training.config import TrainConfig

    assert TrainConfig().resolved_temperature(normalize=False, similarity="dot") == 1.0
    assert TrainConfig().resolved_temperature(normalize=True, similarity="dot") == 0.05
    assert TrainConfig().resolved_temperature(normalize=False, similarity="cosine") == 0.05
    assert TrainConfig(temperature=0.5).resolved_temperature(normalize=True, similarity="dot") == 0.5


def test_train_config_builds_the_loss_config():
    from taser.models.config import BiEncoderConfig
    from taser.training.config import TrainConfig

    auto = TrainConfig(temperature=None)
    assert auto.loss_config(BiEncoderConfig(normalize=True)) == LossConfig("dot", 0.05, True)
    assert auto.loss_config(BiEncoderConfig(similarity="cosine")) == LossConfig("cosine", 0.05, True)
    assert auto.loss_config(BiEncoderConfig()) == LossConfig("dot", 1.0, True)
    fixed = TrainConfig(temperature=0.5, in_batch=False).loss_config(BiEncoderConfig(normalize=True, similarity="l2"))
    assert fixed == LossConfig("l2", 0.5, False)


# -- the triplet loss (DPR Table 6): mean over the question's negative candidates of max(0, m - s+ + s-) --
@pytest.mark.parametrize(
    "similarity, margin, in_batch, expected",
    [
        # q0 scores [2, 0, 0, 1] (positive 2); q1 scores [0, 1, 3, 1] (positive 3)
        ("dot", 3.0, True, [(1 + 1 + 2) / 3, (0 + 1 + 1) / 3]),
        ("dot", 3.0, False, [1.0, 1.0]),  # own groups: q0 against n0 (0), q1 against n1 (1)
        ("dot", 1.0, True, [0.0, 0.0]),  # every negative beaten by the margin
        # negative squared distances: q0 [-1, -2, -10, -1] (positive -1); q1 [-5, 0, -4, -1] (positive -4)
        ("l2", 1.0, True, [(0 + 0 + 1) / 3, (0 + 5 + 4) / 3]),
        # cosines: q0 [1, 0, 0, 1/sqrt 2] (positive 1); q1 [0, 1, 1, 1/sqrt 2] (positive 1)
        ("cosine", 1.0, True, [(0 + 0 + 1 / math.sqrt(2)) / 3, (0 + 1 + 1 / math.sqrt(2)) / 3]),
    ],
)
def test_triplet_loss_matches_hand_computed(similarity, margin, in_batch, expected):
    config = LossConfig(similarity, 1.0, in_batch, loss="triplet", margin=margin)
    loss, correct = retrieval_loss(Q, CTX, POS, OWNER, config)
    assert loss.tolist() == pytest.approx(expected, rel=1e-6)
    nll_correct = retrieval_loss(Q, CTX, POS, OWNER, LossConfig(similarity, 1.0, in_batch))[1]
    assert correct.tolist() == nll_correct.tolist()  # the same argmax whatever the loss


def test_triplet_loss_ignores_the_temperature_and_a_question_without_negatives_costs_nothing():
    a = retrieval_loss(Q, CTX, POS, OWNER, LossConfig("dot", 1.0, True, "triplet", 3.0))[0]
    b = retrieval_loss(Q, CTX, POS, OWNER, LossConfig("dot", 0.05, True, "triplet", 3.0))[0]
    assert a.tolist() == b.tolist()
    ctx = CTX[[0, 2, 3]]  # question 0 has only its positive in its own group
    loss, _ = retrieval_loss(Q, ctx, torch.tensor([0, 1]), torch.tensor([0, 1, 1]), LossConfig("dot", 1.0, False, "triplet", 3.0))
    assert loss.tolist() == pytest.approx([0.0, 1.0])


def test_triplet_loss_gradient_pulls_the_positive_up_and_the_violating_negative_down():
    q = Q.clone().requires_grad_(True)
    ctx = CTX.clone().requires_grad_(True)
    loss, _ = retrieval_loss(q, ctx, POS, OWNER, LossConfig("dot", 1.0, False, "triplet", 3.0))
    loss.sum().backward()
    # q0 = [1, 0]: d/d p0 = -q0, d/d n0 = +q0 (the hinge is active)
    assert ctx.grad[0].tolist() == pytest.approx([-1.0, 0.0]) and ctx.grad[1].tolist() == pytest.approx([1.0, 0.0])


def test_bad_loss_settings_are_refused():
    from taser.training.config import TrainConfig

    with pytest.raises(ValueError, match="unknown loss 'hinge'"):
        LossConfig(loss="hinge")
    with pytest.raises(ValueError, match="margin must be > 0"):
        LossConfig(loss="triplet", margin=0.0)
    with pytest.raises(ValueError, match="unknown train.loss 'hinge'; expected one of nll, triplet"):
        TrainConfig(loss="hinge")
    with pytest.raises(ValueError, match="train.margin"):
        TrainConfig(loss="triplet", margin=-1.0)
    with pytest.raises(ValueError, match="train.temperature=0.05 scales the NLL"):
        TrainConfig(loss="triplet", temperature=0.05)


def test_the_train_config_passes_the_loss_and_margin_on():
    from taser.models.config import BiEncoderConfig
    from taser.training.config import TrainConfig

    config = TrainConfig(loss="triplet", margin=0.5).loss_config(BiEncoderConfig(similarity="l2"))
    assert (config.loss, config.margin, config.similarity) == ("triplet", 0.5, "l2")
