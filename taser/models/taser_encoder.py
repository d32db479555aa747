"""TASER (Cheng et al. 2023): one BERT-family encoder with input-type-specialised blocks.

`specialize_encoder` turns chosen blocks of a `transformers` BERT-family model (BERT, MiniLM,
RoBERTa, ELECTRA: blocks at `encoder.layer[i]` with `attention` and `intermediate`/`output`)
into mixture-of-experts blocks, in place:

- `specialize="ffn"`: the FFN sub-layer (intermediate dense + activation + output dense +
  dropout + residual LayerNorm) becomes `MoEFeedForward` (`layer.output`), with
  `layer.intermediate` a pass-through;
- `specialize="attention"`: the attention sub-layer (self-attention + output dense + dropout +
  residual LayerNorm) becomes `MoEAttention` (`layer.attention`).

Expert 0 is the original module and the others are deep copies, so the specialised encoder
starts out computing exactly what the pretrained one computes, whatever the route. Learned
routers read the state entering the specialised sub-layer (`[CLS]`, position 0, for
`learned_sequence`; each token for `learned_token`); a shared gate is registered once, as
`encoder.taser_gate`.

The layout is a pure function of the settings dict (see `taser.models.taser_config`); the
resolved settings, `specialized_layers` included, are written back into that dict, which the
bi-encoder saves in its `config.json` and hands back here when loading.
"""

from __future__ import annotations

import copy
from contextlib import contextmanager
from typing import Iterator

import torch
from torch import nn

from taser.models.moe import FFNExpert, MixtureOfExperts, MoEAttention, MoEFeedForward
from taser.models.routers import SIDE_EXPERT, AuxLoss, LearnedRouter, RoutingState
from taser.models.taser_config import TaserConfig

__all__ = ["AuxLoss", "collect_aux_loss", "encoder_layers", "input_type", "moe_modules", "specialize_encoder"]

STATE_ATTR = "_taser_routing"
SHARED_GATE_ATTR = "taser_gate"


def encoder_layers(encoder: nn.Module) -> nn.ModuleList:
    """The block list of a BERT-family model (`model.encoder.layer`), or a clear error."""
    base = getattr(encoder, "base_model", encoder)
    layers = getattr(getattr(base, "encoder", None), "layer", None)
    if not isinstance(layers, nn.ModuleList) or len(layers) == 0:
        raise ValueError(
            f"{type(encoder).__name__} is not a BERT-family encoder: no blocks at `encoder.layer` "
            "(TASER supports BERT, MiniLM, RoBERTa and ELECTRA style models)"
        )
    return layers


def _routing_state(encoder: nn.Module) -> RoutingState:
    state = getattr(encoder, STATE_ATTR, None)
    if state is None:
        raise ValueError(f"{type(encoder).__name__} has not been specialised by specialize_encoder")
    return state


def _replicas(module: nn.Module, count: int, config) -> list[nn.Module]:
    """`module` itself followed by `count - 1` deep copies that keep sharing the model config
    (so that e.g. a later change of attention implementation reaches every expert)."""
    memo = {id(config): config} if config is not None else {}
    return [module] + [copy.deepcopy(module, dict(memo)) for _ in range(count - 1)]


def _capture_token_mask(module: nn.Module, args: tuple, kwargs: dict) -> None:
    """Forward pre-hook on the encoder: keep the batch's (B, T) mask for token-level routing
    statistics (padding tokens are routed but not counted)."""
    mask = kwargs.get("attention_mask", args[1] if len(args) > 1 else None)
    getattr(module, STATE_ATTR).token_mask = mask if isinstance(mask, torch.Tensor) and mask.dim() == 2 else None


def specialize_encoder(encoder: nn.Module, taser_cfg: dict | None) -> None:
    """Replace the sub-layers of the blocks `taser_cfg` chooses by mixtures of experts, in place.

    Validates the settings (ValueError), then writes the resolved settings back into
    `taser_cfg`. See `taser.models.taser_config.TaserConfig` for the keys and their defaults.
    """
    if getattr(encoder, STATE_ATTR, None) is not None:
        raise ValueError(f"{type(encoder).__name__} is already specialised")
    layers = encoder_layers(encoder)
    cfg = TaserConfig.resolve(taser_cfg, num_layers=len(layers))
    model_config = getattr(encoder, "config", None)
    if cfg.routing == "learned_sequence" and cfg.specialize == "ffn" and getattr(model_config, "chunk_size_feed_forward", 0):
        raise ValueError("learned_sequence routing of the FFN needs chunk_size_feed_forward=0 (it reads position 0)")

    reference = next(encoder.parameters())
    hidden_size = model_config.hidden_size
    init_std = getattr(model_config, "initializer_range", 0.02)

    def new_router() -> LearnedRouter:
        router = LearnedRouter(hidden_size, cfg.num_experts, cfg.gumbel_tau, init_std)
        return router.to(device=reference.device, dtype=reference.dtype).train(encoder.training)

    shared = None
    if cfg.learned and cfg.shared_gate:
        shared = new_router()
        setattr(encoder, SHARED_GATE_ATTR, shared)
    state = RoutingState(cfg.learned, cfg.load_balance_weight, cfg.entropy_weight)

    for i in cfg.specialized_layers:
        layer = layers[i]
        router = (shared or new_router()) if cfg.learned else None
        options = dict(routing=cfg.routing, state=state, router=router, own_router=shared is None)
        if cfg.specialize == "ffn":
            if not (isinstance(getattr(layer, "intermediate", None), nn.Module) and isinstance(getattr(layer, "output", None), nn.Module)):
                raise ValueError(f"block {i} of {type(encoder).__name__} has no `intermediate`/`output` FFN modules")
            experts = _replicas(FFNExpert(layer.intermediate, layer.output), cfg.num_experts, model_config)
            layer.intermediate = nn.Identity().train(layer.training)
            layer.output = MoEFeedForward(experts, **options).train(layer.training)
        else:
            attention = getattr(layer, "attention", None)
            if not (hasattr(attention, "self") and hasattr(attention, "output")):
                raise ValueError(f"block {i} of {type(encoder).__name__} has no `attention.self`/`attention.output` modules")
            layer.attention = MoEAttention(_replicas(attention, cfg.num_experts, model_config), **options).train(layer.training)

    setattr(encoder, STATE_ATTR, state)
    encoder.register_forward_pre_hook(_capture_token_mask, with_kwargs=True)
    if taser_cfg is not None:
        taser_cfg.update(cfg.to_dict())


@contextmanager
def input_type(encoder: nn.Module, side: str) -> Iterator[None]:
    """Within the block, `encoder` encodes inputs of type `side` ("question" or "passage")."""
    if side not in SIDE_EXPERT:
        raise ValueError(f"input type must be one of {tuple(SIDE_EXPERT)}, got {side!r}")
    state = _routing_state(encoder)
    previous, state.side = state.side, side
    try:
        yield
    finally:
        state.side = previous


def collect_aux_loss(encoder: nn.Module) -> AuxLoss | None:
    """The weighted routing loss averaged over the forward passes since the last call (which it
    clears); None under deterministic routing, or when no pass was recorded."""
    state = _routing_state(encoder)
    return state.collect() if state.learned else None


def moe_modules(encoder: nn.Module) -> list[MixtureOfExperts]:
    return [m for m in encoder.modules() if isinstance(m, MixtureOfExperts)]
