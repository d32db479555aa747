"""The one way to get a model: `load_model(settings)` for training, `load_checkpoint(path)` for
the stages that encode with a trained one.

From `pretrained` every setting applies. From `init_checkpoint` each setting is either honoured
or refused, never ignored: lengths, dropout, the attention kernel and `unpad` are honoured (they change
how the weights run, not what they are); the model type, pooling, normalisation, similarity
and TASER layout must be left unset (None, the checkpoint's own) or equal the checkpoint's.
`check_settings` applies those rules reading only `config.json`, so a mistake is reported
before any weights or data are loaded.
"""

from __future__ import annotations

import os
from dataclasses import asdict

from taser.models.biencoder import BiEncoder, load_tokenizer, read_checkpoint_config
from taser.models.config import MODEL_KINDS, BiEncoderConfig
from taser.models.pretrained import resolve_pretrained
from taser.models.settings import DEFAULT_MAX_LENGTH, ModelSettings
from taser.models.taser_config import TaserConfig
from taser.runtime import pick_device

# settings that define the checkpoint's weights and vectors: unset or equal to the checkpoint's
_FIXED_BY_CHECKPOINT = ("pooling", "normalize", "similarity")


def _taser_conflicts(asked: TaserConfig, saved: dict) -> list[str]:
    """The TASER settings asked for that differ from the checkpoint's (its layout is resolved)."""
    saved_cfg = TaserConfig.from_dict(saved)
    return [
        f"taser.{key}={value} (checkpoint: {getattr(saved_cfg, key)})"
        for key, value in asdict(asked).items()
        if not (key == "specialized_layers" and value is None) and value != getattr(saved_cfg, key)
    ]


def check_settings(settings: ModelSettings | dict) -> BiEncoderConfig | None:
    """Refuse settings that cannot be applied, reading no weights; the checkpoint's config, if any."""
    settings = ModelSettings.from_value(settings)
    if settings.init_checkpoint is None:
        resolve_pretrained(settings.source)  # a missing local path is an error now
        return None
    saved, _ = read_checkpoint_config(settings.init_checkpoint)
    where = f"model.init_checkpoint={settings.init_checkpoint}"
    if settings.model_type != saved.model_type:
        raise ValueError(f"{where} holds a '{saved.model_type}' model, but model_type '{settings.model_type}' was asked for (choose model={saved.model_type})")
    for key in _FIXED_BY_CHECKPOINT:
        asked = getattr(settings, key)
        if asked is not None and asked != getattr(saved, key):
            raise ValueError(f"model.{key}={asked} conflicts with {where}, saved with {key}={getattr(saved, key)}: leave it null (the checkpoint's own)")
    if saved.kind.specialised:
        conflicts = _taser_conflicts(settings.taser, saved.taser)
        if conflicts:
            raise ValueError(f"{where} was trained with other TASER settings: {', '.join(conflicts)}; leave them at the checkpoint's values")
    return saved


def load_model(settings: ModelSettings | dict):
    """(model, tokenizer): fresh from `pretrained`, or continued from `init_checkpoint`."""
    settings = ModelSettings.from_value(settings)
    check_settings(settings)
    if settings.init_checkpoint is not None:
        model = BiEncoder.load(settings.init_checkpoint, attention=settings.attention)
        tokenizer = load_tokenizer(settings.init_checkpoint)
        for key in ("max_length", "max_question_length"):
            if getattr(settings, key) is not None:
                setattr(model.config, key, getattr(settings, key))
    else:
        model = BiEncoder.from_pretrained(
            settings.source,
            model_type=settings.model_type.value,
            pooling=settings.pooling.value if settings.pooling is not None else "auto",
            normalize="auto" if settings.normalize is None else settings.normalize,
            attention=settings.attention,
            similarity=str(settings.similarity or "dot"),
            max_length=settings.max_length or DEFAULT_MAX_LENGTH,
            max_question_length=settings.max_question_length or DEFAULT_MAX_LENGTH,
            taser=asdict(settings.taser) if MODEL_KINDS[settings.model_type].specialised else {},
        )
        tokenizer = load_tokenizer(settings.source)
    attention_dropout = settings.attention_dropout if settings.attention_dropout is not None else settings.dropout
    model.set_dropout(hidden=settings.dropout, attention=attention_dropout)
    model.unpad = settings.unpad
    return model, tokenizer


def load_checkpoint(checkpoint: str | os.PathLike, device: str = "auto", backend: str = "torch"):
    """(model, tokenizer) of a taser checkpoint on `device`, as saved, for encoding. `backend`
    (`taser.models.backends`): `torch`, or an ONNX Runtime or OpenVINO encoder with the same `encode`."""
    from taser.models.backends import OPENVINO_BACKENDS, Backend, resolve_backend

    target = pick_device(device)
    chosen = resolve_backend(backend, target.type)
    if str(chosen) in OPENVINO_BACKENDS:
        from taser.models.openvino_backend import load_openvino_encoder

        return load_openvino_encoder(checkpoint, str(chosen)), load_tokenizer(checkpoint)
    if chosen != Backend.torch:
        from taser.models.onnx_backend import load_onnx_encoder

        return load_onnx_encoder(checkpoint, str(chosen)), load_tokenizer(checkpoint)
    model = BiEncoder.load(checkpoint)
    return model.to(target), load_tokenizer(checkpoint)
