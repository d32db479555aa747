"""Hugging Face DPR encoders: a `DPRQuestionEncoder` and a `DPRContextEncoder` directory, to and
from a `dpr` model.

transformers' DPR encoder is a BERT model (`question_encoder.bert_model.*`,
`ctx_encoder.bert_model.*`) whose vector is the last layer's `[CLS]` state, scored by dot
product: DPR's rule, which the imported model keeps (`[CLS]`, not normalised, dot). An optional
projection (`projection_dim` > 0, `encode_proj`) has no counterpart here and is refused.
transformers' DPR has no BERT pooler: export leaves it out, and import sets it to zero when the
files lack it (it feeds no vector).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from safetensors.torch import save_file
from transformers import AutoTokenizer, DPRConfig

from taser.models.biencoder import BiEncoder, load_tokenizer
from taser.models.config import BiEncoderConfig
from taser.models.convert.mapping import ConversionError, gather
from taser.models.convert.output import QUESTION_RULE, check_output, output_dir, step, write_readme
from taser.models.convert.target import (
    ARCHITECTURE_FIELDS,
    BERT_FIELDS,
    bert_config,
    check_tokenizer,
    fill,
    is_pooler,
    new_model,
    tensor_shapes,
    write_checkpoint,
)
from taser.models.convert.weights import local_path, read_model_dir
from taser.models.settings import DEFAULT_MAX_LENGTH

log = logging.getLogger(__name__)

# this library's encoder -> (the DPR class holding it, its prefix there, the sub-directory an export writes)
SIDES = {
    "question_encoder": ("DPRQuestionEncoder", "question_encoder.bert_model.", "question_encoder"),
    "passage_encoder": ("DPRContextEncoder", "ctx_encoder.bert_model.", "ctx_encoder"),
}


def _dpr_config(directory: Path) -> dict:
    file = directory / "config.json"
    if not file.is_file():
        raise ConversionError(f"{directory} has no config.json: not a Hugging Face model directory")
    raw = json.loads(file.read_text())
    if raw.get("model_type") != "dpr":
        raise ConversionError(f"{file}: model_type {raw.get('model_type')!r}, not a DPR encoder ('dpr')")
    if raw.get("projection_dim", 0):
        raise ConversionError(
            f"{file}: projection_dim={raw['projection_dim']}: the encoder projects its [CLS] vector (encode_proj), which this library's dpr model does not have"
        )
    return raw


def _tokenizer(question_dir: Path, ctx_dir: Path):
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(question_dir))
    except (OSError, ValueError) as err:
        raise ConversionError(f"{question_dir}: no tokenizer could be read ({err})") from err
    try:
        ctx_tokenizer = AutoTokenizer.from_pretrained(str(ctx_dir))
    except (OSError, ValueError):
        return tokenizer  # the context directory may come without one
    if ctx_tokenizer.get_vocab() != tokenizer.get_vocab():
        raise ConversionError(f"{question_dir} and {ctx_dir} hold different tokenizer vocabularies: a dpr model reads both sides with one tokenizer")
    return tokenizer


def import_hf_dpr(
    question_encoder: str | os.PathLike,
    ctx_encoder: str | os.PathLike,
    output: str | os.PathLike,
    max_length: int | None = None,
    overwrite: bool = False,
    allow_pickle: bool = False,
) -> BiEncoder:
    """Write the pair as a `dpr` checkpoint at `output` and return the model.

    `question_encoder`, `ctx_encoder`: directories (or hub names) of a `DPRQuestionEncoder` and a
    `DPRContextEncoder`; `max_length`: the tokens read per question and passage (None: 256, DPR's).
    """
    dirs = {"question_encoder": local_path(question_encoder), "passage_encoder": local_path(ctx_encoder)}
    check_output(output, overwrite, tuple(dirs.values()))
    raws = {side: _dpr_config(d) for side, d in dirs.items()}
    q, c = raws["question_encoder"], raws["passage_encoder"]
    differ = [f"{k} ({q.get(k)} vs {c.get(k)})" for k in ARCHITECTURE_FIELDS if q.get(k) != c.get(k)]
    if differ:
        raise ConversionError(
            f"{dirs['question_encoder']} and {dirs['passage_encoder']} differ in {', '.join(differ)}: a dpr model's encoders share one architecture"
        )
    encoder_config = bert_config(q, str(dirs["question_encoder"] / "config.json"))
    tokenizer = _tokenizer(dirs["question_encoder"], dirs["passage_encoder"])
    check_tokenizer(tokenizer, encoder_config, str(dirs["question_encoder"]))
    length = max_length or DEFAULT_MAX_LENGTH
    config = BiEncoderConfig(
        model_type="dpr", pretrained=f"{question_encoder} + {ctx_encoder}", pooling="cls", normalize=False, similarity="dot",
        max_length=length, max_question_length=length,
    )  # fmt: skip
    model = new_model(config, encoder_config)
    shapes = tensor_shapes(model)
    state = {}
    for side, (_, prefix, _) in SIDES.items():
        source, file = read_model_dir(dirs[side], allow_pickle)
        step(f"read {file}")
        names = {name: prefix + name[len(side) + 1 :] for name in shapes if name.startswith(side + ".")}
        state.update(gather(source, names, shapes, str(file), optional=is_pooler))
    fill(model, state)
    write_checkpoint(model, tokenizer, output, overwrite)
    return model


def export_hf_dpr(checkpoint: str | os.PathLike, output: str | os.PathLike, overwrite: bool = False) -> Path:
    """Write a `dpr` checkpoint as `output/question_encoder/` and `output/ctx_encoder/`, the
    directories transformers' `DPRQuestionEncoder` and `DPRContextEncoder` load."""
    check_output(output, overwrite, (checkpoint,))
    model = BiEncoder.load(checkpoint)
    step(f"read {checkpoint}")
    cfg = model.config
    if cfg.model_type != "dpr":
        raise ConversionError(
            f"{checkpoint} holds a '{cfg.model_type}' model; the Hugging Face DPR pair is two separate encoders: only a 'dpr' model exports to it"
        )
    if (cfg.pooling, cfg.normalize, cfg.similarity) != ("cls", False, "dot"):
        raise ConversionError(
            f"{checkpoint} uses pooling={cfg.pooling}, normalize={cfg.normalize}, similarity={cfg.similarity}; transformers' DPR encoders "
            "give the [CLS] vector, scored by dot product: export this model to sentence-transformers instead"
        )
    encoder_config = model.encoder_config
    if encoder_config.model_type != "bert":
        raise ConversionError(f"{checkpoint} has '{encoder_config.model_type}' encoders; transformers' DPR encoders are BERT models")
    fields = {k: getattr(encoder_config, k) for k in BERT_FIELDS}
    tokenizer = load_tokenizer(checkpoint)
    with output_dir(output, overwrite) as tmp:
        for side, (dpr_class, prefix, subdir) in SIDES.items():
            directory = tmp / subdir
            directory.mkdir()
            DPRConfig(**fields, projection_dim=0, architectures=[dpr_class]).save_pretrained(str(directory))
            state = {prefix + k: v.detach().contiguous() for k, v in getattr(model, side).state_dict().items() if not k.startswith("pooler.")}
            save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
            tokenizer.save_pretrained(str(directory))
        write_readme(tmp, "A taser dpr checkpoint as transformers' DPR encoders", checkpoint, [
            f"Questions (`question_encoder/`, `DPRQuestionEncoder`): {QUESTION_RULE}; at most {cfg.max_question_length} tokens.",
            f"Passages (`ctx_encoder/`, `DPRContextEncoder`): `tokenizer(title, text, truncation='longest_first', max_length={cfg.max_length})` "
            "(the text alone when there is no title), as DPR's `text_to_tensor` does, and token_type_ids all zero: DPR passes zeros, "
            "while a pair's tokenizer output marks the text with ones.",
            "Scores: dot product of the `pooler_output` vectors (the last layer's [CLS] states).",
        ])  # fmt: skip
    step(f"write {output}")
    log.info("wrote the Hugging Face DPR pair to %s/{question_encoder,ctx_encoder}", output)
    return Path(output)
