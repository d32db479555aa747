"""TASER (Cheng et al. 2023): one BERT-family encoder with input-type-specialised blocks.

`specialize_encoder` turns chosen blocks of a `transformers` BERT-family model (BERT, MiniLM,
RoBERTa, ELECTRA: blocks at `encoder.layer[i]` with `attention` and `intermediate`/`output`)
into mixture-of-experts blocks, in place:

- `specialize="ffn"`: the block becomes a `SpecializedBlock`: its own attention, then a
  `MoEFeedForward` whose experts are copies of the block's FFN (intermediate dense +
  activation + output dense + dropout + residual LayerNorm);
- `specialize="attention"`: the attention sub-layer (self-attention + output dense + dropout +
  residual LayerNorm) becomes `MoEAttention` (`layer.attention`).

Expert 0 is the original module and the others are deep copies, so the specialised encoder
starts out computing exactly what the pretrained one computes, whatever the route. Learned
routers read the state entering the specialised sub-layer (`[CLS]`, position 0, for
`learned_sequence`; each token for `learned_token`); a shared gate is registered once, as
`encoder.taser_gate`, and travels to the layers with each pass's `RoutingContext`.

Each pass is called with `taser_routing=RoutingContext(side, token_mask, shared_gate)`, which
`transformers` hands to every block: the input type and the routers' decisions travel with the
call (see `encode`), not as state on the modules.

The layout is a pure function of the settings dict (see `taser.models.taser_config`); the
resolved settings, `specialized_layers` included, are written back into that dict, which the
bi-encoder saves in its `config.json` and hands back here when loading.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from taser.models.moe import FFNExpert, MixtureOfExperts, MoEAttention, MoEFeedForward, SpecializedBlock
from taser.models.routers import AuxLoss, LearnedRouter, RoutingContext, aux_loss
from taser.models.taser_config import TaserConfig
from taser.models.unpad import encoder_states

__all__ = ["encode", "encoder_layers", "moe_modules", "specialize_encoder"]

SHARED_GATE_ATTR = "taser_gate"
SETTINGS_ATTR = "taser_settings"


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


def _replicas(module: nn.Module, count: int, config) -> list[nn.Module]:
    """`module` itself followed by `count - 1` deep copies that keep sharing the model config
    (so that e.g. a later change of attention implementation reaches every expert)."""
    memo = {id(config): config} if config is not None else {}
    return [module] + [copy.deepcopy(module, dict(memo)) for _ in range(count - 1)]


def specialize_encoder(encoder: nn.Module, taser_cfg: dict | None) -> None:
    """Replace the sub-layers of the blocks `taser_cfg` chooses by mixtures of experts, in place.

    Validates the settings (ValueError), then writes the resolved settings back into
    `taser_cfg`. See `taser.models.taser_config.TaserConfig` for the keys and their defaults.
    """
    if isinstance(getattr(encoder, SETTINGS_ATTR, None), TaserConfig):
        raise ValueError(f"{type(encoder).__name__} is already specialised")
    layers = encoder_layers(encoder)
    cfg = TaserConfig.resolve(taser_cfg, num_layers=len(layers))
    model_config = getattr(encoder, "config", None)
    if getattr(model_config, "chunk_size_feed_forward", 0):
        raise ValueError("TASER needs chunk_size_feed_forward=0 (its FFN experts run on whole blocks)")

    reference = next(encoder.parameters())
    hidden_size = model_config.hidden_size
    init_std = getattr(model_config, "initializer_range", 0.02)

    def new_router() -> LearnedRouter:
        router = LearnedRouter(hidden_size, cfg.num_experts, cfg.gumbel_tau, init_std)
        return router.to(device=reference.device, dtype=reference.dtype).train(encoder.training)

    shared = cfg.learned and cfg.shared_gate
    if shared:
        setattr(encoder, SHARED_GATE_ATTR, new_router())

    for i in cfg.specialized_layers:
        layer = layers[i]
        router = new_router() if cfg.learned and not shared else None
        if cfg.specialize == "ffn":
            if not (isinstance(getattr(layer, "intermediate", None), nn.Module) and isinstance(getattr(layer, "output", None), nn.Module)):
                raise ValueError(f"block {i} of {type(encoder).__name__} has no `intermediate`/`output` FFN modules")
            experts = _replicas(FFNExpert(layer.intermediate, layer.output), cfg.num_experts, model_config)
            ffn = MoEFeedForward(experts, cfg.routing, router, learned_shared=shared)
            layers[i] = SpecializedBlock(layer.attention, ffn).train(layer.training)
        else:
            attention = getattr(layer, "attention", None)
            if not (hasattr(attention, "self") and hasattr(attention, "output")):
                raise ValueError(f"block {i} of {type(encoder).__name__} has no `attention.self`/`attention.output` modules")
            experts = _replicas(attention, cfg.num_experts, model_config)
            layer.attention = MoEAttention(experts, cfg.routing, router, learned_shared=shared).train(layer.training)

    setattr(encoder, SETTINGS_ATTR, cfg)
    if taser_cfg is not None:
        taser_cfg.update(cfg.to_dict())


def encode(
    encoder: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, side: str, unpad: bool = False, call=None
) -> tuple[torch.Tensor, AuxLoss | None]:
    """The last hidden states of a specialised encoder for inputs of type `side`, and the
    routing loss of this pass (None under deterministic routing); `unpad`: run on the real
    tokens only (`taser.models.unpad`), which routes and counts them alone, as the padded pass counts them;
    `call`: the padded pass through it (`taser.models.unpad.encoder_states`)."""
    cfg = getattr(encoder, SETTINGS_ATTR, None)
    if not isinstance(cfg, TaserConfig):
        raise ValueError(f"{type(encoder).__name__} has not been specialised by specialize_encoder")
    context = RoutingContext(side, attention_mask, getattr(encoder, SHARED_GATE_ATTR, None))
    hidden = encoder_states(encoder, input_ids, attention_mask, unpad, call=call, taser_routing=context)
    return hidden, aux_loss(context.records, cfg.load_balance_weight, cfg.entropy_weight)


def moe_modules(encoder: nn.Module) -> list[MixtureOfExperts]:
    return [m for m in encoder.modules() if isinstance(m, MixtureOfExperts)]
