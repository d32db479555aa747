"""TASER's released checkpoint (microsoft/taser, e.g. `kelvinih/taser-bert-base-uncased`'s
`pytorch_model.bin`) to and from a `taser` model.

The file is in DPR's checkpoint layout (`taser.models.convert.dpr_state`); its `model_dict` holds
TASER's `MoEBertModel` under `question_model.encoder.*`, and again under `ctx_model.encoder.*`
(one shared encoder, saved under both names). Its blocks are BERT's, except the blocks of the
`moe_type` layout (`mod3`: every third, counting from 1, so 2, 5, 8, 11 of 12), whose FFN is
replaced by experts: `moe_layer.interm_layers.<e>.dense` (intermediate dense, then the
activation) and `moe_layer.output_layers.<e>.{dense,LayerNorm}` (output dense, dropout, residual
LayerNorm). Questions run expert 0 and passages expert 1; the vector is the last layer's `[CLS]`
state, scored by dot product.

That is this library's `taser` model with deterministic routing and FFN experts: its block i's
`output.experts.<e>.intermediate.*` and `output.experts.<e>.output.*` are TASER's
`moe_layer.interm_layers.<e>.*` and `moe_layer.output_layers.<e>.*`; every other tensor keeps its
name. The specialised blocks are read from the tensor names; settings the file records that this
model cannot reproduce (learned routing, attention or token-level experts, mean pooling,
projections) are refused, and so are separate question and passage encoders (`ctx_model` tensors
that differ from `question_model`'s).
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

import torch

from taser.models.biencoder import BiEncoder, load_tokenizer
from taser.models.config import BiEncoderConfig
from taser.models.convert.conversions import TASER_PINNED_TRANSFORMERS, saves_position_ids
from taser.models.convert.dpr_state import RELEASE_FILE, DprCheckpoint, base_encoder, read_dpr_checkpoint
from taser.models.convert.mapping import ConversionError, gather, listing
from taser.models.convert.output import check_output, output_dir, step, write_readme
from taser.models.convert.target import check_tokenizer, fill, is_pooler, new_model, tensor_shapes, write_checkpoint
from taser.models.taser_config import TaserConfig, layout

log = logging.getLogger(__name__)

QUESTION, CONTEXT = "question_model.encoder.", "ctx_model.encoder."
OURS = "question_encoder."
_THEIR_EXPERT = re.compile(r"^question_model\.encoder\.encoder\.layer\.(\d+)\.moe_layer\.(?:interm_layers|output_layers)\.(\d+)\.")
_OUR_EXPERT = re.compile(r"^(encoder\.layer\.\d+\.)output\.experts\.(\d+)\.(intermediate|output)\.")
_GROUP = {"intermediate": "interm_layers", "output": "output_layers"}
MOE_PERIODS = (2, 3, 4, 6, 12)  # TASER's `mod<k>` layouts: block i is specialised when (i + 1) % k == 0


def their_name(ours: str) -> str:
    """TASER's name of a tensor of this library's `taser` model."""
    rest = ours.removeprefix(OURS)
    expert = _OUR_EXPERT.match(rest)
    if expert:
        block, index, part = expert.groups()
        rest = f"{block}moe_layer.{_GROUP[part]}.{index}.{rest[expert.end() :]}"
    return QUESTION + rest


def _check_settings(checkpoint: DprCheckpoint) -> None:
    """Refuse the TASER settings recorded in the file that this library's model does not compute.
    (Whether the encoder is shared is read from the tensors, not from `shared_encoder`.)"""
    enc = checkpoint.encoder
    wrong = []
    if "use_moe" in enc and not enc["use_moe"]:
        wrong.append("use_moe=false (no experts: import it with conversion=import_dpr_cp)")
    moe_type = enc.get("moe_type")
    if moe_type is not None:
        kind = str(moe_type).partition(":")[2]
        if "fwd" not in kind or "attn" in kind or "tok" in kind:
            wrong.append(f"moe_type={moe_type!r} (supported: FFN experts per input, '<layout>:fwd')")
    for key, why in (
        ("use_infer_expert", "learned routing"),
        ("mean_pool", "mean pooling"),
        ("factor_rep", "factored vectors"),
        ("projection_dim", "a projection"),
    ):
        if enc.get(key):
            wrong.append(f"{key}={enc[key]} ({why})")
    if wrong:
        raise ConversionError(
            f"{checkpoint.path} records TASER settings that this library's taser model does not reproduce: {'; '.join(wrong)}. "
            "It imports TASER's released layout: FFN experts chosen by input type, one shared encoder, [CLS] vectors"
        )


def _question_tensors(checkpoint: DprCheckpoint) -> dict[str, torch.Tensor]:
    """The `question_model.*` tensors; `ctx_model.*`, if present, must repeat them (one shared encoder)."""
    state = checkpoint.model_dict
    context = {QUESTION + n[len(CONTEXT) :]: t for n, t in state.items() if n.startswith(CONTEXT)}
    question = {n: t for n, t in state.items() if not n.startswith(CONTEXT)}
    if context:
        own = {n for n in question if n.startswith(QUESTION)}
        differ = sorted(set(context) ^ own) + sorted(n for n in set(context) & own if not torch.equal(context[n], question[n]))
        if differ:
            names = [CONTEXT + n[len(QUESTION) :] if n in context else n for n in differ]
            raise ConversionError(
                f"{checkpoint.path}: ctx_model.encoder does not repeat question_model.encoder ({len(names)} tensors differ or lack a twin: "
                f"{listing(names)}); TASER's release shares one encoder (shared_encoder=true), separate encoders are not supported"
            )
    return question


def _specialised_blocks(names, path) -> list[int]:
    found = {(int(m[1]), int(m[2])) for n in names if (m := _THEIR_EXPERT.match(n))}
    if not found:
        raise ConversionError(
            f"{path} has no mixture-of-experts blocks (question_model.encoder.encoder.layer.<i>.moe_layer.*): not a TASER checkpoint "
            "(DPR's own checkpoint: conversion=import_dpr_cp)"
        )
    experts = sorted({e for _, e in found})
    if experts != [0, 1]:
        raise ConversionError(f"{path}: its blocks have experts {experts}; TASER's layout has two, expert 0 for questions and expert 1 for passages")
    return sorted({block for block, _ in found})


def _taser_settings(blocks: list[int], num_layers: int) -> dict:
    """This library's settings for TASER's specialised `blocks`, as `specialize_every` when it gives them."""
    for every in range(1, num_layers + 1):
        if layout(num_layers, every) == blocks:
            return {"specialize_every": every}
    return {"specialized_layers": blocks}


def import_taser_release(
    path: str | os.PathLike,
    output: str | os.PathLike,
    base_model: str | None = None,
    max_length: int | None = None,
    allow_pickle: bool = False,
    overwrite: bool = False,
) -> BiEncoder:
    """Write TASER's checkpoint `path` (a file, or a directory holding `pytorch_model.bin`) as a
    `taser` checkpoint at `output` and return the model. `max_length` None: the file's
    `sequence_length`, else 256."""
    check_output(output, overwrite, (path,))
    checkpoint = read_dpr_checkpoint(path, allow_pickle)
    _check_settings(checkpoint)
    blocks = _specialised_blocks(checkpoint.model_dict, checkpoint.path)  # first: is it TASER's layout at all
    source = _question_tensors(checkpoint)
    encoder_config, tokenizer, name = base_encoder(checkpoint, base_model)
    check_tokenizer(tokenizer, encoder_config, f"base_model {name}")
    length = checkpoint.max_length(max_length)
    config = BiEncoderConfig(
        model_type="taser", pretrained=f"{checkpoint.path} (TASER checkpoint of {name})", pooling="cls", normalize=False, similarity="dot",
        max_length=length, max_question_length=length, taser=_taser_settings(blocks, encoder_config.num_hidden_layers),
    )  # fmt: skip
    model = new_model(config, encoder_config)
    shapes = tensor_shapes(model)
    fill(model, gather(source, {n: their_name(n) for n in shapes}, shapes, str(checkpoint.path), optional=is_pooler))
    write_checkpoint(model, tokenizer, output, overwrite)
    return model


def _lowercases(tokenizer) -> bool:
    return tokenizer.tokenize("Retrieval") == tokenizer.tokenize("retrieval")


# What TASER's loader reads from `encoder_params` (DPR's `set_cfg_params_from_state`, the version
# TASER's third_party/DPR holds): these six keys, flat; the rest of its encoder settings come from
# its Hydra config and command line (the MoE ones as in `TASER_OVERRIDES`).
TASER_ENCODER_PARAMS = ("do_lower_case", "pretrained_model_cfg", "encoder_model_type", "pretrained_file", "projection_dim", "sequence_length")
# The `encoder_model_type` TASER's `init_biencoder_components_v2` dispatches to its own
# `get_any_biencoder_components` (which builds the MoE encoder); DPR's `hf_bert` builds a plain BERT.
TASER_ENCODER_TYPE = "hf_any"
CHECKPOINT_STATE = ("model_dict", "optimizer_dict", "scheduler_dict", "offset", "epoch", "encoder_params")  # DPR's CheckpointState
# TASER's own names for the base models its MoE encoder builds from (`cfg_name.split("-")[0]`).
TASER_BASE_PREFIXES = ("bert", "Luyu/co", "facebook/contriever")


def taser_overrides(moe_type: str) -> str:
    """The command-line settings TASER's scripts need for the exported file (its release's worksheet passes the same)."""
    return (f"encoder.use_moe=True encoder.moe_type={moe_type} encoder.num_expert=2 encoder.shared_encoder=True "
            "encoder.use_infer_expert=False encoder.per_layer_gating=False encoder.mean_pool=False encoder.factor_rep=False")  # fmt: skip


def export_taser_release(checkpoint: str | os.PathLike, output: str | os.PathLike, base_model: str | None = None, overwrite: bool = False,
                         target_transformers: str | None = None) -> Path:
    """Write a `taser` checkpoint as `output/pytorch_model.bin` in the layout TASER's own scripts load
    (microsoft/taser's `generate_dense_embeddings_v2` and `evaluate_dense_retriever`, `model_file=`).

    The file is DPR's `CheckpointState` dict whose `encoder_params` holds the six flat keys TASER's
    loader reads (`TASER_ENCODER_PARAMS`), `encoder_model_type` `hf_any` (TASER's MoE builder).
    `base_model` (required): the hub name of the BERT model the checkpoint was trained from, written
    as `pretrained_model_cfg`, from which TASER's code builds the encoder and its tokenizer; TASER
    resolves only names such as `bert-base-uncased` (`TASER_BASE_PREFIXES`). The weights are
    TASER's tensor names, under `question_model.encoder.` and again under `ctx_model.encoder.`.

    `target_transformers` (default: TASER's pinned 4.12.5): the transformers version TASER's code
    will load the file with. Before 4.31 BERT's state dict holds the `embeddings.position_ids`
    buffer and TASER's strict `load_state_dict` requires it, as its release files hold it; from
    4.31 on the buffer is not saved and the same key is refused as unexpected, so it is left out.
    """
    target_transformers = target_transformers or TASER_PINNED_TRANSFORMERS
    position_ids = saves_position_ids(target_transformers)
    if not base_model:
        raise ConversionError(
            "export_taser needs base_model=<hub name of the BERT model the checkpoint was trained from, e.g. bert-base-uncased>: "
            "TASER's code builds the encoder and tokenizer from it (encoder_params.pretrained_model_cfg)"
        )
    check_output(output, overwrite, (checkpoint,))
    model = BiEncoder.load(checkpoint)
    step(f"read {checkpoint}")
    cfg = model.config
    if cfg.model_type != "taser":
        raise ConversionError(f"{checkpoint} holds a '{cfg.model_type}' model; only a 'taser' model exports to TASER's layout")
    settings = TaserConfig.from_dict(cfg.taser)
    blocks = list(settings.specialized_layers or [])
    num_layers = model.encoder_config.num_hidden_layers
    periods = [k for k in MOE_PERIODS if layout(num_layers, k - 1) == blocks]
    wrong = [f"{key}={value}" for key, value, want in (("specialize", settings.specialize, "ffn"), ("routing", settings.routing, "deterministic"),
             ("num_experts", settings.num_experts, 2), ("pooling", cfg.pooling, "cls"), ("normalize", cfg.normalize, False),
             ("similarity", cfg.similarity, "dot")) if value != want]  # fmt: skip
    if not periods:
        wrong.append(f"specialised blocks {blocks} (TASER's moe_type mod<k> specialises every k-th block, k in {MOE_PERIODS})")
    if wrong:
        raise ConversionError(f"{checkpoint}: TASER's layout cannot express {', '.join(wrong)}")
    if not str(base_model).startswith(tuple(p + "-" for p in TASER_BASE_PREFIXES)):
        log.warning("base_model=%s: TASER's code resolves only model names starting with %s (e.g. bert-base-uncased); "
                    "it will not build an encoder from this one", base_model, ", ".join(p + "-" for p in TASER_BASE_PREFIXES))  # fmt: skip
    question = {their_name(n): t.detach().contiguous() for n, t in model.state_dict().items()}
    if position_ids:  # the buffer transformers < 4.31 saves, as TASER's release files hold it: 0 .. max_position_embeddings - 1
        question[QUESTION + "embeddings.position_ids"] = torch.arange(model.encoder_config.max_position_embeddings).unsqueeze(0)
    model_dict = {**question, **{CONTEXT + n[len(QUESTION) :]: t for n, t in question.items()}}
    params = {
        "do_lower_case": _lowercases(load_tokenizer(checkpoint)), "pretrained_model_cfg": str(base_model),
        "encoder_model_type": TASER_ENCODER_TYPE, "pretrained_file": None, "projection_dim": 0, "sequence_length": cfg.max_length,
    }  # fmt: skip
    state = {"model_dict": model_dict, "optimizer_dict": None, "scheduler_dict": None, "offset": 0, "epoch": 0, "encoder_params": params}
    moe_type = f"mod{periods[0]}:fwd"
    with output_dir(output, overwrite) as tmp:
        torch.save(state, tmp / RELEASE_FILE)
        write_readme(tmp, "A taser checkpoint in TASER's layout", checkpoint, [
            f"Load `{RELEASE_FILE}` with microsoft/taser's `python -m taser.generate_dense_embeddings_v2` or "
            f"`python -m taser.evaluate_dense_retriever`: `model_file=<path to {RELEASE_FILE}> {taser_overrides(moe_type)}`.",
            f"Written for transformers {target_transformers} "
            f"({'with' if position_ids else 'without'} `embeddings.position_ids`, which transformers < 4.31 saves and later versions refuse; "
            "TASER's environment.yml pins 4.12.5). For another version: `target_transformers=<version>`.",
            "TASER's code prepares the inputs itself, as this library does: questions with \u2019 replaced by ', "
            f"passages as (title, text) pairs truncated longest-first to sequence_length={cfg.max_length}, token types zero.",
        ])  # fmt: skip
    step(f"write {output}")
    if cfg.max_question_length != cfg.max_length:
        log.info("TASER's scripts read questions and passages up to sequence_length=%d tokens (this checkpoint reads questions up to %d)",
                 cfg.max_length, cfg.max_question_length)  # fmt: skip
    log.info("wrote TASER's layout to %s/%s; TASER's scripts load it with model_file=<that file> %s", output, RELEASE_FILE, taser_overrides(moe_type))
    return Path(output)
