"""The levers `roofline.py` measures, one at a time: each a context manager that sets every lever
for the block of steps it wraps, and restores the library's defaults after.

`before` is the step as it was before issue 35's levers (each lever off); each lever's entry
turns that one lever on alone; `library` is the library's defaults (every kept lever on).
"""

from __future__ import annotations

from contextlib import contextmanager

# torch is imported inside the functions: `roofline.py --isa` sets its dispatch before it loads


def _randint_drop_mask(shape, p, device="cpu"):
    """The attention's masks before: one int16 draw per element."""
    import torch

    from taser.models.dropout import RESOLUTION, drop_threshold

    return torch.randint(0, RESOLUTION, shape, dtype=torch.int16, device=device) < drop_threshold(p)


@contextmanager
def _levers(model, hidden_masks: bool, attention_masks: bool):
    import taser.models.attention as attention
    from taser.models.dropout import use_mask_dropout

    use_mask_dropout(model, enabled=hidden_masks)
    default = attention.drop_mask
    if not attention_masks:
        attention.drop_mask = _randint_drop_mask
    try:
        yield
    finally:
        attention.drop_mask = default
        use_mask_dropout(model, enabled=True)


LEVERS = {
    "before": lambda model: _levers(model, hidden_masks=False, attention_masks=False),
    "hidden dropout masks": lambda model: _levers(model, hidden_masks=True, attention_masks=False),
    "attention dropout masks": lambda model: _levers(model, hidden_masks=False, attention_masks=True),
    "library": lambda model: _levers(model, hidden_masks=True, attention_masks=True),
}
