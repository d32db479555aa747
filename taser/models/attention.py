"""Attention for training with attention dropout on CPU, without the unfused fp32 fallback.

PyTorch's SDPA has no fused CPU kernel that applies dropout: with `dropout_p > 0` it falls back
to the math path, which materialises the (batch, heads, L, L) scores, probabilities, dropout
mask and dropped probabilities in fp32 and keeps them for backward, in every layer. At DPR's
settings that is most of the gap between attention dropout 0.1 and 0 (1.3 GB of peak memory,
~20% of step time on 2 cores).

`ChunkedDropoutAttention` computes the same function a few sequences at a time, so the L x L
temporaries stay small and in cache, and keeps for backward only q, k, v, the softmax
log-normaliser, the dropout's keep-mask as bools (drawn by `taser.models.dropout.keep_mask`, p
rounded to a multiple of 2**-15) and the attention mask as an additive bias of its own shape (the
(B, 1, L, L) bools of `sdpa_mask` become 0 / -inf once per call, added to each chunk's scores and
broadcast over the heads, never expanded); backward recomputes the probabilities. Masks are
applied by arithmetic, not `masked_fill`: on CPU, adding a broadcast bias and multiplying by a
0/1 byte mask are each about 10x faster than `masked_fill` with a bool mask (`benchmarks/peers/
results.md`, "The roofline"). Matrix products run in the inputs' dtype (bf16 under autocast),
the softmax and its gradient in fp32.

The implementation registered as `taser_sdpa` (the default of every taser encoder) is SDPA
itself, except on CPU with attention dropout, where it uses `ChunkedDropoutAttention`. The
dropout mask is drawn from the global torch generator, so seeding and the gradient cache's RNG
replay reproduce it.

`taser_sdpa` also runs packed (padding-free) batches: given a `PackedLayout` as `taser_packing`
(see `taser.models.unpad`), it scatters the packed q, k, v into the padded layouts of the
layout's length groups, runs the kernel above on each with its mask and gathers the real
tokens' outputs.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from taser.models.config import TASER_SDPA, Attention
from taser.models.dropout import drop_threshold, keep_mask
from taser.models.unpad import PACKING_KWARG

__all__ = ["ATTENTION_IMPLEMENTATIONS", "Attention", "ChunkedDropoutAttention", "TASER_SDPA", "chunked_dropout_attention"]

ATTENTION_IMPLEMENTATIONS = Attention.names()
CHUNK_ELEMENTS = 1 << 20  # about 4 MB of fp32 scores per chunk


def _rows_per_chunk(q: torch.Tensor, k: torch.Tensor) -> int:
    per_row = q.shape[1] * q.shape[2] * k.shape[2]
    return max(1, CHUNK_ELEMENTS // per_row)


def _mask_scores(scores: torch.Tensor, mask: torch.Tensor | None, rows: slice) -> torch.Tensor:
    """Mask a chunk's scores in place: a boolean keep-mask (True = attend) or an additive float mask.

    A mask with batch dimension 1 is shared by every sequence, so it is not indexed by `rows`."""
    if mask is None:
        return scores
    chunk = mask[rows] if mask.shape[0] > 1 else mask
    if mask.dtype == torch.bool:
        return scores.masked_fill_(~chunk, float("-inf"))
    return scores.add_(chunk)


def _as_bias(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean keep-mask as an additive mask of the same shape: 0 where attended, -inf elsewhere."""
    if mask.dtype != torch.bool:
        return mask.to(dtype)
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))


class ChunkedDropoutAttention(torch.autograd.Function):
    """softmax(q k^T * scale, masked) with dropout p, times v; q, k, v are (B, H, L, D).

    `mask`: None, a boolean keep-mask, or an additive float mask in the softmax's dtype
    (`chunked_dropout_attention` passes the additive form).

    The per-element work on the (L x L) scores is kept to what the function needs: the scale is
    applied to q and the dropout's 1 / (1 - p) to the output (and to the output's gradient), both
    (L x D); the softmax exponentiates once; and its backward's row sums, sum_j dP_ij P_ij, are
    taken as sum_d dO_id O_id, which equals it, dropout included (FlashAttention's identity)."""

    @staticmethod
    def forward(ctx, q, k, v, mask, p: float, scale: float):
        acc = torch.promote_types(q.dtype, torch.float32)
        keep_scale = 1.0 / (1.0 - p)
        out = torch.empty_like(q)
        lse = torch.empty((*q.shape[:-1], 1), dtype=acc, device=q.device)
        keep = torch.empty((*q.shape[:-1], k.shape[-2]), dtype=torch.bool, device=q.device) if drop_threshold(p) else None
        q_scaled = q * scale
        step = _rows_per_chunk(q, k)
        with torch.autocast(q.device.type, enabled=False):
            for b0 in range(0, q.shape[0], step):
                rows = slice(b0, b0 + step)
                scores = _mask_scores(torch.matmul(q_scaled[rows], k[rows].transpose(-1, -2)).to(acc), mask, rows)
                top = scores.amax(-1, keepdim=True)
                if mask is not None:
                    top.nan_to_num_(neginf=0.0)  # a fully masked row: its probabilities exp(-inf) = 0
                probs = scores.sub_(top).exp_()
                # >= 1 where a key is attended (its largest term is exp(0)); 0 for a fully masked row,
                # which the clamp leaves at probabilities 0 and a log-normaliser 0
                total = probs.sum(-1, keepdim=True).clamp_min_(1.0)
                probs.div_(total)
                lse[rows] = top.add_(total.log_())
                if keep is not None:
                    keep[rows] = chunk_keep = keep_mask(probs.shape, p, q.device)
                    probs.mul_(chunk_keep.view(torch.uint8))  # probabilities are finite: x * 0 = 0
                out[rows] = torch.matmul(probs.to(q.dtype), v[rows])
        if keep is not None:
            out.mul_(keep_scale)
        ctx.save_for_backward(q_scaled, k, v, mask, lse, keep, out)
        ctx.scale, ctx.keep_scale = scale, keep_scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q_scaled, k, v, mask, lse, keep, out = ctx.saved_tensors
        scale, keep_scale = ctx.scale, ctx.keep_scale
        grad_out = grad_out.to(q_scaled.dtype)
        acc = lse.dtype
        row_dot = (grad_out.to(acc) * out.to(acc)).sum(-1, keepdim=True)  # sum_j dP_ij P_ij
        grad_kept = grad_out * keep_scale if keep is not None else grad_out  # the gradient through the 1 / (1 - p)
        grad_q, grad_k, grad_v = torch.empty_like(q_scaled), torch.empty_like(k), torch.empty_like(v)
        step = _rows_per_chunk(q_scaled, k)
        with torch.autocast(q_scaled.device.type, enabled=False):
            for b0 in range(0, q_scaled.shape[0], step):
                rows = slice(b0, b0 + step)
                scores = _mask_scores(torch.matmul(q_scaled[rows], k[rows].transpose(-1, -2)).to(acc), mask, rows)
                probs = scores.sub_(lse[rows]).exp_()
                grad_probs = torch.matmul(grad_kept[rows], v[rows].transpose(-1, -2)).to(acc)
                kept = probs
                if keep is not None:
                    chunk_keep = keep[rows].view(torch.uint8)
                    kept = probs * chunk_keep
                    grad_probs.mul_(chunk_keep)
                grad_v[rows] = torch.matmul(kept.to(v.dtype).transpose(-1, -2), grad_kept[rows])
                # softmax backward, P * (dP - row_dot), overwriting probs; its scale goes on grad_q below
                grad_scores = probs.mul_(grad_probs.sub_(row_dot[rows])).to(q_scaled.dtype)
                grad_q[rows] = torch.matmul(grad_scores, k[rows])
                grad_k[rows] = torch.matmul(grad_scores.transpose(-1, -2), q_scaled[rows])
        return grad_q.mul_(scale), grad_k, grad_v, None, None, None


def chunked_dropout_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, dropout: float, scale: float | None = None
) -> torch.Tensor:
    """Attention of (B, H, L, D) inputs with a (B|1, 1|H, Lq, Lk) boolean or additive mask; (B, H, Lq, D) out."""
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"attention dropout must be in [0, 1), got {dropout}")
    if k.shape[1] != q.shape[1]:
        raise ValueError("chunked attention needs as many key/value heads as query heads")
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if mask is not None:
        mask = _as_bias(mask, torch.promote_types(q.dtype, torch.float32))  # added to the fp32 scores
    # contiguous once here, rather than copied by every chunk's matmul, forward and backward
    q, k, v = (t.contiguous() for t in (q, k, v))
    return ChunkedDropoutAttention.apply(q, k, v, mask, float(dropout), float(scale))


def taser_sdpa_forward(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """transformers attention interface: SDPA, or `ChunkedDropoutAttention` for CPU dropout;
    a packed batch (`taser_packing`) is unpacked around the kernel."""
    packing = kwargs.pop(PACKING_KWARG, None)
    if packing is None:
        return _padded_attention(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    if query.shape[0] != 1 or attention_mask is not None:
        raise ValueError("a packed batch comes as one row of tokens with no attention mask of its own (see taser.models.unpad)")
    outputs = [
        _padded_attention(module, q, k, v, group.mask, dropout, scaling, **kwargs)[0]
        for group, q, k, v in zip(packing.groups, *(packing.unpack_heads(t) for t in (query, key, value)))
    ]
    return packing.pack_heads(outputs), None


def _padded_attention(module, query, key, value, attention_mask, dropout: float, scaling, **kwargs):
    special = kwargs.get("position_bias") is not None or kwargs.get("is_causal") or getattr(module, "is_causal", False)
    if dropout == 0.0 or query.device.type != "cpu" or special or key.shape[1] != query.shape[1]:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    out = chunked_dropout_attention(query, key, value, attention_mask, dropout, scaling)
    return out.transpose(1, 2).contiguous(), None


def taser_sdpa_mask(*args, **kwargs):
    """transformers' SDPA mask without its check for a batch with no padding: that check reads
    the mask back to the host (`.all()`), a sync per encoder call on a GPU. A mask of all ones
    costs the kernel little; the check would cost the queue of work.

    Without a padding mask there is no mask: every token sees every token, or the batch is packed
    (`taser.models.unpad`), whose length groups bring their own masks. transformers >= 5.25 would
    build a (tokens x tokens) mask for a packed batch from its restarting position ids."""
    if kwargs.get("attention_mask") is None:
        return None
    kwargs["allow_is_bidirectional_skip"] = False
    return sdpa_mask(*args, **kwargs)


AttentionInterface.register(TASER_SDPA, taser_sdpa_forward)
AttentionMaskInterface.register(TASER_SDPA, taser_sdpa_mask)
