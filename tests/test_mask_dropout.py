"""CPU dropout with 15-bit threshold masks (taser.models.dropout): the rate, the lanes'
independence, the exact forward and backward, and where it is used."""

import pytest
import torch
from conftest import tiny_model_cfg
from torch import nn

from taser.models.dropout import MaskDropout, drop_mask, drop_threshold, keep_mask, use_mask_dropout
from taser.models.loading import load_model


def test_every_lane_drops_at_the_rounded_rate_independently():
    torch.manual_seed(0)
    n, p = 1 << 22, 0.1
    drop = drop_mask((n,), p).float()
    rate = drop_threshold(p) / 2**15
    assert rate == pytest.approx(0.100006, abs=1e-6)
    sd = (rate * (1 - rate) / (n / 4)) ** 0.5
    lanes = drop.view(-1, 4)  # the four 16-bit lanes of each 64-bit draw; the last one's top bit is never set
    for lane in range(4):
        assert abs(float(lanes[:, lane].mean()) - rate) < 5 * sd, lane
    # independent lanes: both of two neighbours dropped as often as the product says
    both = float((lanes[:, 0] * lanes[:, 1]).mean())
    assert abs(both - rate * rate) < 5 * (rate * rate / (n / 4)) ** 0.5


def test_keep_and_drop_masks_are_complements_of_one_draw():
    torch.manual_seed(3)
    keep = keep_mask((5, 7, 3), 0.3)
    torch.manual_seed(3)
    assert torch.equal(drop_mask((5, 7, 3), 0.3), ~keep)
    assert keep.shape == (5, 7, 3) and keep.dtype == torch.bool


def test_forward_and_backward_are_the_seeded_masks_scaled():
    p = 0.25
    x = torch.randn(6, 11, requires_grad=True)
    layer = MaskDropout(p).train()
    torch.manual_seed(7)
    out = layer(x)
    torch.manual_seed(7)
    keep = keep_mask(x.shape, p)
    assert 0 < int((~keep).sum()) < int(keep.sum())
    torch.testing.assert_close(out, torch.where(keep, x * (1 / (1 - p)), 0.0), rtol=0, atol=0)
    grad = torch.randn_like(out)
    (got,) = torch.autograd.grad(out, x, grad)
    torch.testing.assert_close(got, torch.where(keep, grad * (1 / (1 - p)), 0.0), rtol=0, atol=0)


def test_eval_and_zero_rate_are_the_identity():
    x = torch.randn(4, 5)
    assert torch.equal(MaskDropout(0.5).eval()(x), x)
    assert torch.equal(MaskDropout(0.0).train()(x), x)


def test_the_bi_encoder_drops_with_mask_dropout_at_its_rates(tiny_pretrained):
    model, _ = load_model(tiny_model_cfg(tiny_pretrained, "dpr", dropout=0.2, attention_dropout=0.1))
    dropouts = [m for m in model.modules() if isinstance(m, nn.Dropout)]
    assert dropouts and all(type(m) is MaskDropout for m in dropouts)
    assert {m.p for m in dropouts} == {0.2, 0.1}
    assert use_mask_dropout(model, enabled=False) == len(dropouts)
    assert all(type(m) is nn.Dropout for m in model.modules() if isinstance(m, nn.Dropout))
