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
  layouts and a gather back.
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
    default_kernel, default_layout = attention.ChunkedDropoutAttention, PackedLayout.__dict__["from_mask"]
    if not attention_kernel:
        attention.ChunkedDropoutAttention = _BEFORE.setdefault("kernel", _kernel_before())
    if not layout_views:
        PackedLayout.from_mask = classmethod(_scattering_layout(PackedLayout.from_mask))
    try:
        yield
    finally:
        attention.ChunkedDropoutAttention = default_kernel
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
    "library": lambda model: _levers(model, hidden_masks=True, attention_kernel=True, layout_views=True),
}

SETTINGS = {**LEVERS, **REFERENCES}
