"""A `shared` or `dpr` model as a sentence-transformers directory, written file by file (the
library does not import sentence-transformers).

- `shared`: the encoder at the root (`config.json`, `model.safetensors`, tokenizer files,
  `sentence_bert_config.json`), then `1_Pooling/` and, for a normalised model, `2_Normalize/`:
  the layout every sentence-transformers release reads;
- `dpr`: a `Router` (sentence-transformers >= 5) whose `query` route is the question encoder and
  whose `document` route is the passage encoder, each a Transformer and a Pooling directory, then
  `1_Normalize/` for a normalised model: `encode_query` and `encode_document` give this library's
  question and passage vectors.

Pooling, normalisation and similarity are the checkpoint's; each route reads at most the
checkpoint's `max_question_length` (queries) or `max_length` (documents) tokens. A `shared` model
has one Transformer and so one length, `max_length`: a question longer than `max_question_length`
is read further than this library reads it.

sentence-transformers encodes one string per text, so a passage is given as `title [SEP] text`
(`taser.models.inputs.passage_string`; the text alone without a title) and a question after
`normalize_question` (’ -> '), as the exported `README.md` says. The string's token ids are
this library's (DPR's pair encoding, token types all zero) unless truncation applies: the
string is cut at its end only, where the pair is cut longest-first, so passages whose title is
longer than about half of `max_length - 3` tokens are read differently. (Passing
sentence-transformers a (title, text) tuple instead would set token type 1 on the text, which
neither this library nor DPR does.) A `taser` model routes questions and passages to different
experts inside one encoder, which sentence-transformers cannot express: it is refused.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from safetensors.torch import save_file

from taser.models.biencoder import BiEncoder, load_tokenizer
from taser.models.convert.mapping import ConversionError
from taser.models.convert.output import QUESTION_RULE, check_output, output_dir, step, write_readme

log = logging.getLogger(__name__)

MODULES = "sentence_transformers.models."
SIMILARITY = {"dot": "dot", "cosine": "cosine", "l2": "euclidean"}  # l2 (negative squared distance) ranks as euclidean


def _write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2) + "\n")


def _pooling(directory: Path, width: int, pooling: str) -> None:
    directory.mkdir()
    _write_json(
        directory / "config.json",
        {
            "word_embedding_dimension": width,
            "pooling_mode_cls_token": pooling == "cls",
            "pooling_mode_mean_tokens": pooling == "mean",
            "pooling_mode_max_tokens": False,
            "pooling_mode_mean_sqrt_len_tokens": False,
            "pooling_mode_weightedmean_tokens": False,
            "pooling_mode_lasttoken": False,
            "include_prompt": True,
        },
    )


def _transformer(directory: Path, encoder, tokenizer, max_length: int) -> None:
    directory.mkdir(exist_ok=True)
    encoder.config.save_pretrained(str(directory))
    state = {k: v.detach().contiguous() for k, v in encoder.state_dict().items()}
    save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
    tokenizer.save_pretrained(str(directory))
    _write_json(directory / "sentence_bert_config.json", {"max_seq_length": max_length, "do_lower_case": False})


def _module(index: int, path: str, kind: str) -> dict:
    return {"idx": index, "name": str(index), "path": path, "type": MODULES + kind}


def export_sentence_transformers(checkpoint: str | os.PathLike, output: str | os.PathLike, overwrite: bool = False) -> Path:
    """Write a `shared` or `dpr` checkpoint as a sentence-transformers directory at `output`."""
    check_output(output, overwrite, (checkpoint,))
    model = BiEncoder.load(checkpoint)
    step(f"read {checkpoint}")
    cfg = model.config
    if cfg.kind.specialised:
        raise ConversionError(
            f"{checkpoint} holds a '{cfg.model_type}' model, whose blocks route questions and passages to different experts: "
            "sentence-transformers cannot express that; export 'shared' or 'dpr' models"
        )
    tokenizer = load_tokenizer(checkpoint)
    width = model.encoder_config.hidden_size
    with output_dir(output, overwrite) as tmp:
        if cfg.kind.two_encoders:
            types, structure = {}, {}
            for route, encoder, length in (("query", model.question_encoder, cfg.max_question_length), ("document", model.passage_encoder, cfg.max_length)):
                transformer, pooling = f"{route}_0_Transformer", f"{route}_1_Pooling"
                _transformer(tmp / transformer, encoder, tokenizer, length)
                _pooling(tmp / pooling, width, cfg.pooling)
                types.update({transformer: MODULES + "Transformer", pooling: MODULES + "Pooling"})
                structure[route] = [transformer, pooling]
            _write_json(
                tmp / "router_config.json", {"types": types, "structure": structure, "parameters": {"default_route": "document", "allow_empty_key": True}}
            )
            modules = [_module(0, "", "Router")]
        else:
            if cfg.max_question_length != cfg.max_length:
                log.info("one Transformer reads up to max_length=%d tokens of questions too (this library: %d)", cfg.max_length, cfg.max_question_length)
            _transformer(tmp, model.question_encoder, tokenizer, cfg.max_length)
            _pooling(tmp / "1_Pooling", width, cfg.pooling)
            modules = [_module(0, "", "Transformer"), _module(1, "1_Pooling", "Pooling")]
        if cfg.normalize:
            path = f"{len(modules)}_Normalize"
            (tmp / path).mkdir()
            modules.append(_module(len(modules), path, "Normalize"))
        _write_json(tmp / "modules.json", modules)
        _write_json(tmp / "config_sentence_transformers.json", {"prompts": {}, "default_prompt_name": None, "similarity_fn_name": SIMILARITY[cfg.similarity]})
        sep = tokenizer.sep_token
        query, document = ("`encode_query`", "`encode_document`") if cfg.kind.two_encoders else ("`encode`", "`encode`")
        write_readme(tmp, "A taser checkpoint as a sentence-transformers model", checkpoint, [
            f"Questions ({query}): {QUESTION_RULE}.",
            f"Passages ({document}): one string `title {sep} text` (the text alone when there is no title). "
            f"Its tokens are DPR's pair encoding of (title, text), token types all zero, unless the string is longer than "
            f"{cfg.max_length} tokens: it is then cut at its end, where the model was trained on pairs cut longest-first "
            f"(a long title cut too). Do not pass (title, text) tuples: they set token type 1 on the text.",
            f"Scores: {SIMILARITY[cfg.similarity]}.",
        ])  # fmt: skip
    step(f"write {output}")
    log.info("wrote a sentence-transformers directory to %s", output)
    return Path(output)
