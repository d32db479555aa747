"""The levers `roofline.py` measures, one at a time: each a context manager that sets every lever
for the block of steps it wraps, and restores the library's defaults after.

`before` is the step as it was before issue 35's levers, each lever off (q, k and v are made
contiguous once per attention call in every setting); each lever's entry turns that one lever on
alone; `library` is the library's defaults, every kept lever on. Huge-page tensors are a
process-wide setting: `roofline.py --huge-pages-pairs` compares them in pairs of processes.

- hidden dropout masks: `taser.models.dropout.MaskDropout` against `nn.Dropout` (`bernoulli_`);
- attention kernel: `taser.models.attention.ChunkedDropoutAttention` against the kernel before
  (kept below as it was: one int16 draw per mask element, the scales and the softmax's row sums
  on the L x L scores, two exponentials in forward);
- attention groups as views: the packed tokens in group order against a scatter into zeroed
  layouts and a gather back;
- masks by arithmetic (a second round, on top of the three): the attention mask added as a 0/-inf
  bias and both dropout masks applied by multiplying with their bytes, against `masked_fill` with
  the bool masks and `torch.where` (`library at e72d41c` keeps that code below). Since this round,
  the first round's "hidden dropout masks" and "attention kernel" run the library's code with it;
  their recorded figures (results.md) were measured before it.
"""

from __future__ import annotations

from contextlib import contextmanager

# torch is imported inside the functions: `roofline.py --isa` sets its dispatch before it loads


def _kernel_before():
    """The chunked attention kernel as it was at commit c3ea7f1, before the levers."""
    import torch

    from taser.models.attention import _mask_scores, _rows_per_chunk
    from taser.models.dropout import RESOLUTION

    class Before(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, mask, p, scale):
            acc = torch.promote_types(q.dtype, torch.float32)
            threshold = round(p * RESOLUTION)
            keep_scale = 1.0 / (1.0 - p)
            out = torch.empty_like(q)
            lse = torch.empty(q.shape[:-1], dtype=acc, device=q.device)
            keep = torch.empty((*q.shape[:-1], k.shape[-2]), dtype=torch.bool, device=q.device) if threshold else None
            step = _rows_per_chunk(q, k)
            with torch.autocast(q.device.type, enabled=False):
                for b0 in range(0, q.shape[0], step):
                    rows = slice(b0, b0 + step)
                    scores = _mask_scores(torch.matmul(q[rows], k[rows].transpose(-1, -2)).to(acc).mul_(scale), mask, rows)
                    log_norm = torch.logsumexp(scores, -1, keepdim=True).nan_to_num_(neginf=0.0)
                    lse[rows] = log_norm.squeeze(-1)
                    probs = scores.sub_(log_norm).exp_()
                    if keep is not None:
                        random = torch.randint(0, RESOLUTION, probs.shape, dtype=torch.int16, device=q.device)
                        keep[rows] = chunk_keep = random >= threshold
                        probs.mul_(chunk_keep).mul_(keep_scale)
                    out[rows] = torch.matmul(probs.to(q.dtype), v[rows])
            ctx.save_for_backward(q, k, v, mask, lse, keep)
            ctx.scale, ctx.keep_scale = scale, keep_scale
            return out

        @staticmethod
        def backward(ctx, grad_out):
            q, k, v, mask, lse, keep = ctx.saved_tensors
            scale, keep_scale = ctx.scale, ctx.keep_scale
            grad_out = grad_out.to(q.dtype)
            grad_q, grad_k, grad_v = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
            step = _rows_per_chunk(q, k)
            with torch.autocast(q.device.type, enabled=False):
                for b0 in range(0, q.shape[0], step):
                    rows = slice(b0, b0 + step)
                    scores = _mask_scores(torch.matmul(q[rows], k[rows].transpose(-1, -2)).to(lse.dtype).mul_(scale), mask, rows)
                    probs = scores.sub_(lse[rows].unsqueeze(-1)).exp_()
                    grad_dropped = torch.matmul(grad_out[rows], v[rows].transpose(-1, -2)).to(lse.dtype)
                    if keep is not None:
                        chunk_keep = keep[rows]
                        dropped = (probs * chunk_keep).mul_(keep_scale)
                        grad_probs = grad_dropped.mul_(chunk_keep).mul_(keep_scale)
                    else:
                        dropped, grad_probs = probs, grad_dropped
                    grad_v[rows] = torch.matmul(dropped.to(q.dtype).transpose(-1, -2), grad_out[rows])
                    row_dot = (grad_probs * probs).sum(-1, keepdim=True)
                    grad_scores = probs.mul_(grad_probs.sub_(row_dot)).mul_(scale).to(q.dtype)
                    grad_q[rows] = torch.matmul(grad_scores, k[rows])
                    grad_k[rows] = torch.matmul(grad_scores.transpose(-1, -2), q[rows])
            return grad_q, grad_k, grad_v, None, None, None

    return Before


def _masked_fill_code():
    """The attention kernel and hidden dropout at commit e72d41c: the bool attention mask and the
    dropout masks applied by `masked_fill`, the hidden dropout by `torch.where`."""
    import torch

    from taser.models.attention import _mask_scores, _rows_per_chunk
    from taser.models.dropout import drop_mask, drop_threshold, keep_mask

    class Kernel(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, mask, p, scale):
            acc = torch.promote_types(q.dtype, torch.float32)
            keep_scale = 1.0 / (1.0 - p)
            out = torch.empty_like(q)
            lse = torch.empty((*q.shape[:-1], 1), dtype=acc, device=q.device)
            drop = torch.empty((*q.shape[:-1], k.shape[-2]), dtype=torch.bool, device=q.device) if drop_threshold(p) else None
            q_scaled = q * scale
            step = _rows_per_chunk(q, k)
            with torch.autocast(q.device.type, enabled=False):
                for b0 in range(0, q.shape[0], step):
                    rows = slice(b0, b0 + step)
                    scores = _mask_scores(torch.matmul(q_scaled[rows], k[rows].transpose(-1, -2)).to(acc), mask, rows)
                    top = scores.amax(-1, keepdim=True)
                    if mask is not None:
                        top.nan_to_num_(neginf=0.0)
                    probs = scores.sub_(top).exp_()
                    total = probs.sum(-1, keepdim=True).clamp_min_(1.0)
                    probs.div_(total)
                    lse[rows] = top.add_(total.log_())
                    if drop is not None:
                        drop[rows] = chunk_drop = drop_mask(probs.shape, p, q.device)
                        probs.masked_fill_(chunk_drop, 0.0)
                    out[rows] = torch.matmul(probs.to(q.dtype), v[rows])
            if drop is not None:
                out.mul_(keep_scale)
            ctx.save_for_backward(q_scaled, k, v, mask, lse, drop, out)
            ctx.scale, ctx.keep_scale = scale, keep_scale
            return out

        @staticmethod
        def backward(ctx, grad_out):
            q_scaled, k, v, mask, lse, drop, out = ctx.saved_tensors
            scale, keep_scale = ctx.scale, ctx.keep_scale
            grad_out = grad_out.to(q_scaled.dtype)
            acc = lse.dtype
            row_dot = (grad_out.to(acc) * out.to(acc)).sum(-1, keepdim=True)
            grad_kept = grad_out * keep_scale if drop is not None else grad_out
            grad_q, grad_k, grad_v = torch.empty_like(q_scaled), torch.empty_like(k), torch.empty_like(v)
            step = _rows_per_chunk(q_scaled, k)
            with torch.autocast(q_scaled.device.type, enabled=False):
                for b0 in range(0, q_scaled.shape[0], step):
                    rows = slice(b0, b0 + step)
                    scores = _mask_scores(torch.matmul(q_scaled[rows], k[rows].transpose(-1, -2)).to(acc), mask, rows)
                    probs = scores.sub_(lse[rows]).exp_()
                    grad_probs = torch.matmul(grad_kept[rows], v[rows].transpose(-1, -2)).to(acc)
                    kept = probs
                    if drop is not None:
                        chunk_drop = drop[rows]
                        kept = probs.masked_fill(chunk_drop, 0.0)
                        grad_probs.masked_fill_(chunk_drop, 0.0)
                    grad_v[rows] = torch.matmul(kept.to(v.dtype).transpose(-1, -2), grad_kept[rows])
                    grad_scores = probs.mul_(grad_probs.sub_(row_dot[rows])).to(q_scaled.dtype)
                    grad_q[rows] = torch.matmul(grad_scores, k[rows])
                    grad_k[rows] = torch.matmul(grad_scores.transpose(-1, -2), q_scaled[rows])
            return grad_q.mul_(scale), grad_k, grad_v, None, None, None

    class Dropout(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, p):
            keep = keep_mask(x.shape, p, x.device)
            ctx.save_for_backward(keep)
            ctx.scale = 1.0 / (1.0 - p)
            return torch.where(keep, x * ctx.scale, 0.0)

        @staticmethod
        def backward(ctx, grad):
            (keep,) = ctx.saved_tensors
            return torch.where(keep, grad * ctx.scale, 0.0), None

    return _passing_mask_as_given(Kernel), Dropout


def _passing_mask_as_given(kernel):
    """`chunked_dropout_attention` as it was up to e72d41c: a bool mask reaches the kernel as bools."""
    import torch

    def attend(q, k, v, mask, dropout, scale=None):
        scale = q.shape[-1] ** -0.5 if scale is None else scale
        if mask is not None and mask.dtype != torch.bool:
            mask = mask.to(torch.promote_types(q.dtype, torch.float32))
        q, k, v = (t.contiguous() for t in (q, k, v))
        return kernel.apply(q, k, v, mask, float(dropout), float(scale))

    return attend


@contextmanager
def _masks_by_masked_fill(model):
    import taser.models.attention as attention
    import taser.models.dropout as dropout

    default = attention.chunked_dropout_attention, dropout._MaskedDropout
    attention.chunked_dropout_attention, dropout._MaskedDropout = _BEFORE.setdefault("masked_fill", _masked_fill_code())
    try:
        with _levers(model, hidden_masks=True, attention_kernel=True, layout_views=True):
            yield
    finally:
        attention.chunked_dropout_attention, dropout._MaskedDropout = default


def _scattering_layout(from_mask):
    """The packed layout as before: every attention group scattered into a zeroed layout and
    gathered back (`slots` set), though no group is padded on CPU."""
    import dataclasses

    import torch

    def layout(cls, mask, group_ratio=None):
        made = from_mask(mask, group_ratio)
        return made if made.slots is not None else dataclasses.replace(made, slots=torch.arange(made.num_tokens, device=mask.device))

    return layout


_BEFORE = {}


@contextmanager
def _levers(model, hidden_masks: bool, attention_kernel: bool, layout_views: bool):
    import taser.models.attention as attention
    from taser.models.dropout import use_mask_dropout
    from taser.models.unpad import PackedLayout

    use_mask_dropout(model, enabled=hidden_masks)
    default_kernel, default_layout = attention.chunked_dropout_attention, PackedLayout.__dict__["from_mask"]
    if not attention_kernel:
        attention.chunked_dropout_attention = _BEFORE.setdefault("kernel", _passing_mask_as_given(_kernel_before()))
    if not layout_views:
        PackedLayout.from_mask = classmethod(_scattering_layout(PackedLayout.from_mask))
    try:
        yield
    finally:
        attention.chunked_dropout_attention = default_kernel
        PackedLayout.from_mask = default_layout
        use_mask_dropout(model, enabled=True)


@contextmanager
def _without_dropout(model, hidden: bool, attention: bool):
    """The library's step with dropout off (not equal maths): what the dropout costs. With no
    attention dropout, the attention runs in PyTorch's fused SDPA kernel."""
    config = model.encoder_config
    rates = config.hidden_dropout_prob, config.attention_probs_dropout_prob
    model.set_dropout(hidden=0.0 if hidden else None, attention=0.0 if attention else None)
    try:
        yield
    finally:
        model.set_dropout(*rates)


# Not levers: the library's step without what equal maths requires ("ref" = not equal maths), to
# show what the remaining gap is made of; without attention dropout the attention is fused SDPA
REFERENCES = {
    "ref no hidden dropout": lambda model: _without_dropout(model, hidden=True, attention=False),
    "ref no attention dropout": lambda model: _without_dropout(model, hidden=False, attention=True),
    "ref no dropout": lambda model: _without_dropout(model, hidden=True, attention=True),
}

LEVERS = {
    "before": lambda model: _levers(model, hidden_masks=False, attention_kernel=False, layout_views=False),
    "hidden dropout masks": lambda model: _levers(model, hidden_masks=True, attention_kernel=False, layout_views=False),
    "attention kernel": lambda model: _levers(model, hidden_masks=False, attention_kernel=True, layout_views=False),
    "attention groups as views": lambda model: _levers(model, hidden_masks=False, attention_kernel=False, layout_views=True),
    "library at e72d41c": _masks_by_masked_fill,
    "library": lambda model: _levers(model, hidden_masks=True, attention_kernel=True, layout_views=True),
}

SETTINGS = {**LEVERS, **REFERENCES}
