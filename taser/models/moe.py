"""Mixture-of-experts sub-layers that replace a BERT-family block's FFN or attention.

Each expert is a copy of the pretrained sub-layer it replaces, so before training every route
computes what the pretrained block computes. Only the experts chosen run, each on its own
inputs:

- deterministic routing: the expert of the input type (`RoutingContext.side`) on the whole batch;
- learned routing: the units (rows, or tokens) are sorted by expert, each expert runs on its
  contiguous slice, and the outputs are scattered back (`dispatch`); the output of a unit is
  multiplied by its straight-through gate (1 in value) so the gate receives gradients.

Token routing of an attention sub-layer runs each expert on the rows holding at least one of
its tokens (attention needs the whole sequence as keys and values) and keeps its tokens' outputs.

A packed (padding-free) pass (`taser_packing`, see `taser.models.unpad`) holds the real tokens
of all inputs in one row: token routing sees only them, and sequence routing decides on each
input's `[CLS]` state and hands the decision (and its gate) to every token of the input, so that
both run as a dispatch over tokens.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from taser.models.routers import SIDE_EXPERT, LearnedRouter, Routing, RoutingContext
from taser.models.unpad import PACKING_KWARG, PackedLayout

LEARNED = ("learned_sequence", "learned_token")


def dispatch(routing: Routing, num_experts: int, run: Callable[[int, torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """out[j] = gate[j] * run(choice[j], indices)[position of j], each expert called once.

    `run(e, idx)` computes expert `e` on the units `idx` (a 1-D index tensor) and returns one
    output row per index, in order.
    """
    choice = routing.choice
    if torch.jit.is_tracing():
        return _dispatch_traced(routing, num_experts, run)
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


def _dispatch_traced(routing: Routing, num_experts: int, run: Callable[[int, torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """`dispatch` as a graph export (ONNX, OpenVINO: a traced pass) can hold it: the split by expert
    counts is data-dependent, and a trace would freeze the example's counts into the graph. Every
    expert runs on every unit instead, and each unit keeps its own expert's output (same values,
    `num_experts` times the compute of the routed sub-layers)."""
    choice = routing.choice
    every = torch.arange(choice.numel(), device=choice.device)
    y = None
    for e in range(num_experts):
        out = run(e, every)
        keep = (choice == e).view(-1, *([1] * (out.dim() - 1)))
        y = torch.where(keep, out, torch.zeros_like(out)) if y is None else torch.where(keep, out, y)
    if routing.gate is not None:
        y = y * routing.gate.to(y.dtype).view(-1, *([1] * (y.dim() - 1)))
    return y


def per_token(routing: Routing, row_ids: torch.Tensor) -> Routing:
    """A decision per input as a decision per token: token j takes the choice and gate of input row_ids[j]."""
    gate = routing.gate.index_select(0, row_ids) if routing.gate is not None else None
    return Routing(routing.choice.index_select(0, row_ids), gate, routing.logits.index_select(0, row_ids))


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

    A learned layer has its own `router`, or none when every layer shares the encoder's gate,
    which then arrives with the pass's `RoutingContext` (it is registered once, on the encoder).
    """

    def __init__(self, experts: list[nn.Module], routing: str, router: LearnedRouter | None = None, learned_shared: bool = False):
        super().__init__()
        if routing in LEARNED and router is None and not learned_shared:
            raise ValueError(f"routing {routing!r} needs a router (its own, or the encoder's shared gate)")
        if routing not in LEARNED and router is not None:
            raise ValueError(f"routing {routing!r} takes no router")
        self.experts = nn.ModuleList(experts)
        self.routing = routing
        self.router = router

    @property
    def num_experts(self) -> int:
        return len(self.experts)

    @staticmethod
    def context(taser_routing: RoutingContext | None) -> RoutingContext:
        if taser_routing is None:
            raise RuntimeError(
                "a TASER encoder needs the input type: call it with taser_routing=RoutingContext('question' | 'passage', ...) "
                "(BiEncoder.encode does)"
            )
        return taser_routing

    def expert_for_side(self, taser_routing: RoutingContext | None) -> int:
        return SIDE_EXPERT[self.context(taser_routing).side]

    def route(self, units: torch.Tensor, taser_routing: RoutingContext | None, mask: torch.Tensor | None = None) -> Routing:
        ctx = self.context(taser_routing)
        gate = self.router if self.router is not None else ctx.shared_gate
        if gate is None:
            raise RuntimeError("this layer routes with the encoder's shared gate, but the RoutingContext carries none")
        routing = gate(units)
        ctx.record(routing, mask)
        return routing

    def route_packed(self, tokens: torch.Tensor, taser_routing: RoutingContext | None, packing: PackedLayout) -> Routing:
        """One decision per real token of a packed pass (`tokens`: (N, H)); sequence routing decides
        on each input's first token and hands its decision to the input's tokens."""
        if self.routing == "learned_sequence":
            return per_token(self.route(tokens.index_select(0, packing.starts), taser_routing), packing.row_ids)
        return self.route(tokens, taser_routing)


class MoEFeedForward(MixtureOfExperts):
    """The FFN sub-layer of a specialised block: each expert is a copy of the pretrained FFN
    (intermediate dense + activation, output dense + dropout + residual LayerNorm)."""

    def forward(self, x: torch.Tensor, taser_routing: RoutingContext | None = None, taser_packing: PackedLayout | None = None) -> torch.Tensor:
        if self.routing == "deterministic":
            return self.experts[self.expert_for_side(taser_routing)](x)
        if taser_packing is not None:  # x: (1, N, H), real tokens only
            tokens = x[0]
            routing = self.route_packed(tokens, taser_routing, taser_packing)
            return dispatch(routing, self.num_experts, lambda e, idx: self.experts[e](tokens.index_select(0, idx))).view_as(x)
        if self.routing == "learned_sequence":
            routing = self.route(x[:, 0], taser_routing)
            return dispatch(routing, self.num_experts, lambda e, idx: self.experts[e](x.index_select(0, idx)))
        flat = x.reshape(-1, x.shape[-1])
        routing = self.route(flat, taser_routing, self.context(taser_routing).flat_mask(x.shape[:2]))
        out = dispatch(routing, self.num_experts, lambda e, idx: self.experts[e](flat.index_select(0, idx)))
        return out.view_as(x)


class SpecializedBlock(nn.Module):
    """A Transformer block whose FFN is a mixture of experts: the block's own attention, then
    `output` (a `MoEFeedForward`). It replaces the pretrained block in the encoder's block list
    and is called as the block was, with the pass's `taser_routing` among the keyword arguments."""

    def __init__(self, attention: nn.Module, output: MoEFeedForward):
        super().__init__()
        self.attention = attention
        self.output = output

    def forward(self, hidden_states: torch.Tensor, attention_mask=None, *args, taser_routing: RoutingContext | None = None, **kwargs):
        for cross_attention_input in ("encoder_hidden_states", "encoder_attention_mask"):  # encoder-only models
            kwargs.pop(cross_attention_input, None)
        attended, _ = self.attention(hidden_states, attention_mask, **kwargs)
        return self.output(attended, taser_routing, kwargs.get(PACKING_KWARG))


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

    def forward(self, hidden_states: torch.Tensor, attention_mask=None, *args, taser_routing: RoutingContext | None = None, **kwargs):
        if self.routing == "deterministic":
            return self.experts[self.expert_for_side(taser_routing)](hidden_states, attention_mask, *args, **kwargs)
        packing = kwargs.get(PACKING_KWARG)
        if packing is not None:
            return self._forward_packed(hidden_states, packing, taser_routing, *args, **kwargs), None
        batch, length, width = hidden_states.shape

        def run_rows(e: int, rows: torch.Tensor) -> torch.Tensor:
            x = hidden_states.index_select(0, rows)
            return self.experts[e](x, _mask_rows(attention_mask, rows, batch), *args, **kwargs)[0]

        if self.routing == "learned_sequence":
            return dispatch(self.route(hidden_states[:, 0], taser_routing), self.num_experts, run_rows), None

        flat = hidden_states.reshape(-1, width)
        routing = self.route(flat, taser_routing, self.context(taser_routing).flat_mask((batch, length)))
        choice = routing.choice.view(batch, length)

        def run_tokens(e: int, idx: torch.Tensor) -> torch.Tensor:
            if torch.jit.is_tracing():  # a graph export: every token (`_dispatch_traced` passes them all), in flat order
                return run_rows(e, torch.arange(batch, device=hidden_states.device)).reshape(-1, width)
            # `idx` holds this expert's tokens in increasing flat position (a stable sort), the
            # order in which a boolean mask selects them from the rows below
            mine = choice == e
            rows = mine.any(1).nonzero().squeeze(1)
            return run_rows(e, rows)[mine.index_select(0, rows)]

        return dispatch(routing, self.num_experts, run_tokens).view(batch, length, width), None

    def _forward_packed(self, hidden_states: torch.Tensor, packing: PackedLayout, taser_routing, *args, **kwargs) -> torch.Tensor:
        """Learned routing of a packed pass ((1, N, H), real tokens only): each expert runs on the
        inputs holding at least one of its tokens and keeps its tokens' outputs."""
        tokens = hidden_states[0]
        routing = self.route_packed(tokens, taser_routing, packing)

        def run_tokens(e: int, idx: torch.Tensor) -> torch.Tensor:
            # `idx` holds this expert's tokens in increasing order, as do `rows` and so `members`
            rows = packing.row_ids.index_select(0, idx).unique()
            members, layout = packing.select_rows(rows)
            out = self.experts[e](hidden_states.index_select(1, members), None, *args, **{**kwargs, PACKING_KWARG: layout})[0]
            return out[0][routing.choice.index_select(0, members) == e]

        return dispatch(routing, self.num_experts, run_tokens).unsqueeze(0)
