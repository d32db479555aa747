"""The chunked dropout attention: exact against eager attention, same masks under a seed, lean."""

import pytest
import torch
from conftest import tiny_model_cfg

import taser.models.attention as attention
from taser.models.attention import chunked_dropout_attention
from taser.models.dropout import drop_threshold, keep_mask
from taser.models.loading import load_model

B, H, L, D = 5, 3, 7, 4


@pytest.fixture
def qkv():
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(B, H, L, D, dtype=torch.float64, generator=gen, requires_grad=True) for _ in range(3)]


@pytest.fixture
def padding_mask():
    lengths = torch.tensor([7, 5, 3, 7, 1])
    keys = torch.arange(L)[None, :] < lengths[:, None]
    return keys[:, None, None, :].expand(B, 1, L, L)  # what transformers' sdpa_mask gives: True = attend


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(attention, "CHUNK_ELEMENTS", 2 * H * L * L)  # two sequences a chunk: 3 chunks


def eager(q, k, v, mask, keep=None, p=0.0):
    probs = (q @ k.transpose(-1, -2) * D**-0.5).masked_fill(~mask, float("-inf")).softmax(-1)
    if keep is not None:
        probs = probs * keep / (1 - p)
    return probs @ v


def test_equals_eager_attention_without_dropout(qkv, padding_mask, small_chunks):
    out = chunked_dropout_attention(*qkv, padding_mask, 0.0)
    ref = eager(*qkv, padding_mask)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    grad = torch.randn_like(out)
    for mine, theirs in zip(torch.autograd.grad(out, qkv, grad), torch.autograd.grad(ref, qkv, grad)):
        torch.testing.assert_close(mine, theirs, rtol=0, atol=1e-12)


def test_broadcast_mask_over_several_chunks_equals_eager(qkv, small_chunks):
    """A (1, 1, L, L) mask is shared by every sequence, in every chunk, forward and backward."""
    mask = torch.rand(1, 1, L, L, generator=torch.Generator().manual_seed(2)) < 0.6
    mask[..., 0] = True  # no fully masked row
    out = chunked_dropout_attention(*qkv, mask, 0.0)
    ref = eager(*qkv, mask)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    grad = torch.randn_like(out)
    for mine, theirs in zip(torch.autograd.grad(out, qkv, grad), torch.autograd.grad(ref, qkv, grad)):
        torch.testing.assert_close(mine, theirs, rtol=0, atol=1e-12)


def test_dropout_is_on_the_probabilities_with_the_seeded_mask(qkv, padding_mask):
    p = 0.25
    torch.manual_seed(5)
    out = chunked_dropout_attention(*qkv, padding_mask, p)  # one chunk: one draw of the whole mask
    torch.manual_seed(5)
    keep = keep_mask((B, H, L, L), p)
    assert 0 < (~keep).sum() < keep.sum()
    ref = eager(*qkv, padding_mask, keep, p)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    grad = torch.randn_like(out)
    for mine, theirs in zip(torch.autograd.grad(out, qkv, grad), torch.autograd.grad(ref, qkv, grad)):
        torch.testing.assert_close(mine, theirs, rtol=0, atol=1e-12)


def test_gradients_with_dropout_pass_gradcheck(qkv, padding_mask, small_chunks):
    def attend(q, k, v):
        torch.manual_seed(3)  # the same masks on every call
        return chunked_dropout_attention(q, k, v, padding_mask, 0.3)

    assert torch.autograd.gradcheck(attend, tuple(qkv))


def test_dropout_rate_and_expectation():
    p = 0.1
    q = torch.zeros(64, 4, 64, 8)  # uniform attention: each output is the kept share of the row, rescaled
    v = torch.ones(64, 4, 64, 8)
    torch.manual_seed(0)
    out = chunked_dropout_attention(q, q, v, None, p)
    assert out.mean().item() == pytest.approx(1.0, abs=0.01)
    dropped = 1 - out[..., 0] * (1 - p)  # share of the row dropped
    assert dropped.mean().item() == pytest.approx(p, abs=0.005)


def test_fully_masked_row_gives_zeros_not_nan(qkv):
    mask = torch.ones(B, 1, L, L, dtype=torch.bool)
    mask[0, 0, 2, :] = False
    out = chunked_dropout_attention(*qkv, mask, 0.2)
    assert torch.isfinite(out).all() and (out[0, :, 2] == 0).all()
    grads = torch.autograd.grad(out.sum(), qkv)
    assert all(torch.isfinite(g).all() for g in grads)


def test_bf16_autocast_stays_close_to_fp32(padding_mask):
    """q, k, v made by a layer under autocast come out bf16; the result stays close to fp32."""
    torch.manual_seed(1)
    project = torch.nn.Linear(H * 32, 3 * H * 32)
    x = torch.randn(B, L, H * 32)

    def attend():
        q, k, v = project(x).view(B, L, 3, H, 32).permute(2, 0, 3, 1, 4)
        return q.dtype, chunked_dropout_attention(q, k, v, padding_mask, 0.0)

    ref_dtype, ref = attend()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low_dtype, low = attend()
    assert ref_dtype == ref.dtype == torch.float32
    assert low_dtype == low.dtype == torch.bfloat16
    torch.testing.assert_close(low.float(), ref, rtol=0.02, atol=0.02)


def test_rejects_bad_dropout(qkv):
    with pytest.raises(ValueError, match="attention dropout"):
        chunked_dropout_attention(*qkv, None, 1.0)


@pytest.mark.parametrize("dropout", [0.0, 0.2])
def test_model_vectors_equal_transformers_sdpa(tiny_pretrained, tokenizer, dropout):
    """In evaluation (no dropout) and in training without dropout, taser_sdpa is transformers' SDPA."""
    ours, _ = load_model(tiny_model_cfg(tiny_pretrained, "dpr", dropout=dropout))
    theirs, _ = load_model(tiny_model_cfg(tiny_pretrained, "dpr", dropout=dropout, attention="sdpa"))
    assert ours.question_encoder.config._attn_implementation == "taser_sdpa"
    assert theirs.question_encoder.config._attn_implementation == "sdpa"
    batch = tokenizer(["who wrote hamlet", "a much longer question about the university of chicago"], padding=True, return_tensors="pt")
    if dropout:
        ours.eval(), theirs.eval()
    with torch.no_grad():
        a = ours.encode(batch["input_ids"], batch["attention_mask"], "passage")
        b = theirs.encode(batch["input_ids"], batch["attention_mask"], "passage")
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_model_chunked_path_equals_transformers_sdpa(tiny_pretrained, tokenizer, monkeypatch):
    """In training with attention dropout, taser_sdpa runs the chunked kernel on sdpa_mask's mask as a bias.

    An attention dropout of 1e-9 rounds to a drop threshold of 0: no dropout mask is drawn and
    nothing is dropped, so the result must be SDPA's without dropout."""
    assert drop_threshold(1e-9) == 0
    ours, _ = load_model(tiny_model_cfg(tiny_pretrained, "dpr", dropout=0.0, attention_dropout=1e-9))
    theirs, _ = load_model(tiny_model_cfg(tiny_pretrained, "dpr", dropout=0.0, attention_dropout=1e-9, attention="sdpa"))
    ours.train(), theirs.eval()
    ours.unpad = False  # the padded path, with sdpa_mask's mask (the packed one: tests/test_unpad.py)
    batch = tokenizer(["who wrote hamlet", "a much longer question about the university of chicago"], padding=True, return_tensors="pt")
    assert not batch["attention_mask"].all()  # padded
    masks = []
    apply = attention.ChunkedDropoutAttention.apply

    def spy(q, k, v, mask, p, scale):
        masks.append(mask)
        return apply(q, k, v, mask, p, scale)

    monkeypatch.setattr(attention.ChunkedDropoutAttention, "apply", spy)
    with torch.no_grad():
        a = ours.encode(batch["input_ids"], batch["attention_mask"], "passage")
        b = theirs.encode(batch["input_ids"], batch["attention_mask"], "passage")
    assert len(masks) == ours.passage_encoder.config.num_hidden_layers
    # sdpa_mask's bools reach the kernel as an additive bias of their own shape: 0 attended, -inf not
    assert all(m.dtype == torch.float32 and m.shape[:2] == (2, 1) and set(m.unique().tolist()) == {0.0, float("-inf")} for m in masks)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_unknown_attention_is_a_clear_error(tiny_pretrained):
    with pytest.raises(ValueError, match="unknown model.attention 'flash'; expected one of taser_sdpa, sdpa, eager"):
        load_model(tiny_model_cfg(tiny_pretrained, "dpr", attention="flash"))


def test_keeps_no_float_attention_matrix_for_backward(qkv, padding_mask):
    """What makes it lean: only q, k, v, the log-normaliser, the output, the attention mask (one
    bias for all heads) and a bool dropout mask are saved: no float matrix per head."""
    saved = []

    def pack(t):
        saved.append((tuple(t.shape), t.dtype))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        chunked_dropout_attention(*qkv, padding_mask, 0.1)
    per_head_matrices = [(shape, dtype) for shape, dtype in saved if shape == (B, H, L, L)]
    assert per_head_matrices == [((B, H, L, L), torch.bool)]
    float_matrices = [(shape, dtype) for shape, dtype in saved if shape[-2:] == (L, L) and dtype.is_floating_point]
    assert float_matrices == [((B, 1, L, L), torch.float64)]  # the attention mask as a bias, not expanded over heads
