"""How many parameters a bi-encoder has, and how many encode a question or a passage.

- `dpr`: the question encoder for questions, the passage encoder for passages;
- `shared`: every parameter for both;
- `taser`: every parameter minus the experts an input type cannot reach: under deterministic
  routing the other type's experts; under learned routing all experts of a layer but one (an
  input, or a token, runs one expert per specialised layer), the gates counted.

Parameters of the bi-encoder outside its encoders (none today) count for both input types.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn

from taser.models.routers import SIDE_EXPERT
from taser.models.taser_encoder import moe_modules

if TYPE_CHECKING:
    from taser.models.biencoder import BiEncoder


def count(module: nn.Module | None) -> int:
    return 0 if module is None else sum(p.numel() for p in module.parameters())


def _idle_expert_params(model: BiEncoder, side: str) -> int:
    idle = 0
    for moe in moe_modules(model.question_encoder):
        sizes = [count(expert) for expert in moe.experts]
        # deterministic routing: `side` runs its own expert; learned: one expert per unit (at most the largest)
        used = sizes[SIDE_EXPERT[side]] if moe.routing == "deterministic" else max(sizes)
        idle += sum(sizes) - used
    return idle


def parameter_report(model: BiEncoder) -> dict:
    """`total`, `active_question`, `active_passage` parameter counts (an ONNX Runtime encoder
    carries those of the model it was exported from)."""
    counted = getattr(model, "parameter_counts", None)
    if counted is not None:
        return dict(counted)
    total = count(model)
    kind = model.config.kind
    if kind.two_encoders:
        outside = total - count(model.question_encoder) - count(model.passage_encoder)
        active_q = count(model.question_encoder) + outside
        active_p = count(model.passage_encoder) + outside
    elif kind.specialised:
        active_q = total - _idle_expert_params(model, "question")
        active_p = total - _idle_expert_params(model, "passage")
    else:
        active_q = active_p = total
    return {"model_type": model.config.model_type, "total": total, "active_question": active_q, "active_passage": active_p}
