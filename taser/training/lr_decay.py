"""AdamW parameter groups: no weight decay on biases and norms; optional layer-wise lr decay.

With `layer_decay` d on an encoder of L blocks (ELECTRA-style: the top block keeps the full
rate, since these encoders have no head above it):

    block i (0-indexed)          lr * d ** (L - 1 - i)    top block: lr
    embeddings                   lr * d ** L
    everything else              lr                       pooler, shared TASER gate, heads

A TASER block's experts and its own gate take the block's rate. For `dpr` each encoder is
decayed over its own blocks.
"""

from __future__ import annotations

from torch import nn

from taser.models.taser_encoder import encoder_layers

_NORM_TYPES = (nn.LayerNorm, nn.GroupNorm, nn.BatchNorm1d, nn.BatchNorm2d)


def _no_decay_ids(model: nn.Module) -> set[int]:
    """Biases and normalisation weights."""
    ids = set()
    for module in model.modules():
        is_norm = isinstance(module, _NORM_TYPES) or "norm" in type(module).__name__.lower()
        for name, param in module.named_parameters(recurse=False):
            if is_norm or name == "bias":
                ids.add(id(param))
    return ids


def _depth_scales(encoder: nn.Module, decay: float) -> dict[int, float]:
    """lr multiplier of each parameter of `encoder` that lies in its embeddings or blocks."""
    layers = encoder_layers(encoder)
    base = getattr(encoder, "base_model", encoder)
    num_layers = len(layers)
    scales: dict[int, float] = {}
    for name in ("embeddings", "embeddings_project"):
        module = getattr(base, name, None)
        if isinstance(module, nn.Module):
            for p in module.parameters():
                scales[id(p)] = decay ** num_layers
    for i, layer in enumerate(layers):
        for p in layer.parameters():
            scales[id(p)] = decay ** (num_layers - 1 - i)  # the top block keeps the full lr
    return scales


def param_groups(model: nn.Module, lr: float, weight_decay: float, layer_decay: float | None = None) -> list[dict]:
    """Parameter groups for `torch.optim.AdamW` (each: `params`, `lr`, `weight_decay`).

    `model` is a `BiEncoder` (any model type); `layer_decay=None` keeps one learning rate.
    Frozen parameters (requires_grad False) are left out.
    """
    if not lr > 0:
        raise ValueError(f"learning rate must be > 0, got {lr}")
    if weight_decay < 0:
        raise ValueError(f"weight_decay must be >= 0, got {weight_decay}")
    scales: dict[int, float] = {}
    if layer_decay is not None:
        if not 0 < layer_decay <= 1:
            raise ValueError(f"layer_decay must be in (0, 1], got {layer_decay}")
        for encoder in (getattr(model, "question_encoder", None), getattr(model, "passage_encoder", None)):
            if encoder is not None:
                scales.update(_depth_scales(encoder, layer_decay))
    no_decay = _no_decay_ids(model)

    groups: dict[tuple[float, float], list] = {}
    for param in model.parameters():  # each parameter once, even if shared
        if not param.requires_grad:
            continue
        key = (lr * scales.get(id(param), 1.0), 0.0 if id(param) in no_decay else weight_decay)
        groups.setdefault(key, []).append(param)
    return [{"params": params, "lr": group_lr, "weight_decay": wd} for (group_lr, wd), params in groups.items()]
