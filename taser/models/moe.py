"""Mixture-of-experts sub-layers that replace a BERT-family block's FFN or attention.

Each expert is a copy of the pretrained sub-layer it replaces, so before training every route
computes what the pretrained block computes. Only the experts chosen run, each on its own
inputs:

- deterministic routing: the expert of the input type (`RoutingState.side`) on the whole batch;
- learned routing: the units (rows, or tokens) are sorted by expert, each expert runs on its
  contiguous slice, and the outputs are scattered back (`dispatch`); the output of a unit is
  multiplied by its straight-through gate (1 in value) so the gate receives gradients.

Token routing of an attention sub-layer runs each expert on the rows holding at least one of
its tokens (attention needs the whole sequence as keys and values) and keeps its tokens' outputs.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from taser.models.routers import SIDE_EXPERT, LearnedRouter, Routing, RoutingState

LEARNED = ("learned_sequence", "learned_token")


def dispatch(routing: Routing, num_experts: int, run: Callable[[int, torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """out[j] = gate[j] * run(choice[j], indices)[position of j], each expert called once.

    `run(e, idx)` computes expert `e` on the units `idx` (a 1-D index tensor) and returns one
    output row per index, in order.
    """
    choice = routing.choice
    order = torch.argsort(choice, stable=True)
    counts = torch.bincount(choice, minlength=num_experts).tolist()
    outputs = [run(e, idx) for e, idx in enumerate(order.split(counts)) if idx.numel()]
    if not outputs:  # no unit at all
        return run(0, order)
    y = torch.cat(outputs) if len(outputs) > 1 else outputs[0]
    if routing.gate is not None:
        gate = routing.gate.index_select(0, order).to(y.dtype)
        y = y * gate.view(-1, *([1] * (y.dim() - 1)))
    return torch.empty_like(y).index_copy_(0, order, y)


class FFNExpert(nn.Module):
    """One FFN expert: a BERT block's intermediate (dense + activation) and output
    (dense + dropout + residual LayerNorm) modules, applied as the block applies them."""

    def __init__(self, intermediate: nn.Module, output: nn.Module):
        super().__init__()
        self.intermediate = intermediate
        self.output = output

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.output(self.intermediate(x), x)


class MixtureOfExperts(nn.Module):
    """Experts plus the way inputs are routed to them.

    `router` is owned (registered) by this module unless `own_router` is False, as for a gate
    shared by several layers and registered once elsewhere (no duplicate state-dict entries).
    """

    def __init__(
        self,
        experts: list[nn.Module],
        routing: str,
        state: RoutingState,
        router: LearnedRouter | None = None,
        own_router: bool = True,
    ):
        super().__init__()
        if (routing in LEARNED) != (router is not None):
            raise ValueError(f"routing {routing!r} {'needs' if routing in LEARNED else 'takes no'} router")
        self.experts = nn.ModuleList(experts)
        self.routing = routing
        self._state = state
        if router is not None and own_router:
            self.router = router
        else:
            self._borrowed_router = (router,)  # a tuple: not registered as a sub-module

    @property
    def num_experts(self) -> int:
        return len(self.experts)

    def gate(self) -> LearnedRouter | None:
        return self.router if "router" in self._modules else self._borrowed_router[0]

    def expert_for_side(self) -> int:
        side = self._state.side
        if side not in SIDE_EXPERT:
            raise RuntimeError(
                "deterministic routing needs the input type: encode inside "
                "taser.models.taser_encoder.input_type(encoder, 'question' | 'passage')"
            )
        return SIDE_EXPERT[side]

    def route(self, units: torch.Tensor, mask: torch.Tensor | None = None) -> Routing:
        routing = self.gate()(units)
        self._state.record(routing, mask)
        return routing


class MoEFeedForward(MixtureOfExperts):
    """Replaces a block's `output` module while its `intermediate` becomes a pass-through, so
    the block's `output(intermediate(x), x)` call reaches `forward(x, x)`."""

    def forward(self, hidden_states: torch.Tensor, input_tensor: torch.Tensor) -> torch.Tensor:
        x = input_tensor
        if self.routing == "deterministic":
            return self.experts[self.expert_for_side()](x)
        if self.routing == "learned_sequence":
            routing = self.route(x[:, 0])
            return dispatch(routing, self.num_experts, lambda e, idx: self.experts[e](x.index_select(0, idx)))
        flat = x.reshape(-1, x.shape[-1])
        routing = self.route(flat, self._state.mask_for(x.shape[:2]))
        out = dispatch(routing, self.num_experts, lambda e, idx: self.experts[e](flat.index_select(0, idx)))
        return out.view_as(x)


def _mask_rows(mask, rows: torch.Tensor, batch: int):
    """The attention mask of a subset of the batch's rows (None: no mask)."""
    if mask is None:
        return None
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"learned attention routing needs a tensor attention mask (taser_sdpa, sdpa or eager attention), got {type(mask).__name__}")
    if mask.shape[0] == 1:  # broadcast over the batch
        return mask
    if mask.shape[0] != batch:
        raise ValueError(f"attention mask of shape {tuple(mask.shape)} does not match batch size {batch}")
    return mask.index_select(0, rows)


class MoEAttention(MixtureOfExperts):
    """Replaces a block's `attention` module (self-attention + output dense/LayerNorm);
    each expert is a copy of it, called with the block's arguments."""

    def forward(self, hidden_states: torch.Tensor, attention_mask=None, *args, **kwargs):
        if self.routing == "deterministic":
            return self.experts[self.expert_for_side()](hidden_states, attention_mask, *args, **kwargs)
        batch, length, width = hidden_states.shape

        def run_rows(e: int, rows: torch.Tensor) -> torch.Tensor:
            x = hidden_states.index_select(0, rows)
            return self.experts[e](x, _mask_rows(attention_mask, rows, batch), *args, **kwargs)[0]

        if self.routing == "learned_sequence":
            return dispatch(self.route(hidden_states[:, 0]), self.num_experts, run_rows), None

        flat = hidden_states.reshape(-1, width)
        routing = self.route(flat, self._state.mask_for((batch, length)))
        choice = routing.choice.view(batch, length)

        def run_tokens(e: int, idx: torch.Tensor) -> torch.Tensor:
            # `idx` holds this expert's tokens in increasing flat position (a stable sort), the
            # order in which a boolean mask selects them from the rows below
            mine = choice == e
            rows = mine.any(1).nonzero().squeeze(1)
            return run_rows(e, rows)[mine.index_select(0, rows)]

        return dispatch(routing, self.num_experts, run_tokens).view(batch, length, width), None
