"""The levers `roofline.py` measures, one at a time: each a context manager that sets every lever
for the block of steps it wraps, and restores the library's defaults after.

`before` is the step as it was before issue 35's levers (each lever off; q, k and v are made
contiguous once per attention call in every setting); each lever's entry turns that one lever on
alone; `library` is the library's defaults (every kept lever on). Huge-page tensors are a
process-wide setting: `roofline.py --huge-pages-pairs` compares them in pairs of processes.
"""

from __future__ import annotations

from contextlib import contextmanager

# torch is imported inside the functions: `roofline.py --isa` sets its dispatch before it loads


def _randint_drop_mask(shape, p, device="cpu"):
    """The attention's masks before: one int16 draw per element."""
    import torch

    from taser.models.dropout import RESOLUTION, drop_threshold

    return torch.randint(0, RESOLUTION, shape, dtype=torch.int16, device=device) < drop_threshold(p)


def _scattering_layout(from_mask):
    """The packed layout as before: every attention group scattered into a zeroed layout and
    gathered back (`slots` set), though no group is padded on CPU."""
    import dataclasses

    import torch

    def layout(cls, mask, group_ratio=None):
        made = from_mask(mask, group_ratio)
        return made if made.slots is not None else dataclasses.replace(made, slots=torch.arange(made.num_tokens, device=mask.device))

    return layout


@contextmanager
def _levers(model, hidden_masks: bool, attention_masks: bool, layout_views: bool):
    import taser.models.attention as attention
    from taser.models.dropout import use_mask_dropout
    from taser.models.unpad import PackedLayout

    use_mask_dropout(model, enabled=hidden_masks)
    default_masks, default_layout = attention.drop_mask, PackedLayout.__dict__["from_mask"]
    if not attention_masks:
        attention.drop_mask = _randint_drop_mask
    if not layout_views:
        PackedLayout.from_mask = classmethod(_scattering_layout(PackedLayout.from_mask))
    try:
        yield
    finally:
        attention.drop_mask = default_masks
        PackedLayout.from_mask = default_layout
        use_mask_dropout(model, enabled=True)


LEVERS = {
    "before": lambda model: _levers(model, hidden_masks=False, attention_masks=False, layout_views=False),
    "hidden dropout masks": lambda model: _levers(model, hidden_masks=True, attention_masks=False, layout_views=False),
    "attention dropout masks": lambda model: _levers(model, hidden_masks=False, attention_masks=True, layout_views=False),
    "attention groups as views": lambda model: _levers(model, hidden_masks=False, attention_masks=False, layout_views=True),
    "library": lambda model: _levers(model, hidden_masks=True, attention_masks=True, layout_views=True),
}
