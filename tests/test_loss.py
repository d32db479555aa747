"""The contrastive NLL against hand-computed values, for each similarity and mode."""

import math

import pytest
import torch

from taser.training.loss import LossConfig, contrastive_nll

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
    loss, correct = contrastive_nll(Q, CTX, POS, OWNER, LossConfig(similarity, temperature, in_batch))
    assert loss.tolist() == pytest.approx(expected, rel=1e-6)


def test_correct_counts_argmax():
    _, correct = contrastive_nll(Q, CTX, POS, OWNER, LossConfig("dot"))
    assert correct.tolist() == [True, True]
    _, correct = contrastive_nll(Q, CTX, torch.tensor([1, 2]), OWNER, LossConfig("dot"))
    assert correct.tolist() == [False, True]


def test_uneven_negative_counts():
    # question 0 has no negative left (ctx = [p0, p1, n1])
    ctx = CTX[[0, 2, 3]]
    loss, _ = contrastive_nll(Q, ctx, torch.tensor([0, 1]), torch.tensor([0, 1, 1]), LossConfig("dot", in_batch=False))
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
