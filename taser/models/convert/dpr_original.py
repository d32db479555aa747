"""DPR's own training checkpoint (`.cp`) to a `dpr` model.

Its `model_dict` holds two BERT models, `question_model.*` and `ctx_model.*` (DPR's
`HFBertEncoder`, a `BertModel` with its pooler), whose vectors are the last layer's `[CLS]`
states scored by dot product. A projection (`projection_dim` > 0, `encode_proj`) has no
counterpart here and is refused. The BERT config and tokenizer come from the model DPR was
trained from (`encoder_params`' `pretrained_model_cfg`, or `base_model`).
"""

from __future__ import annotations

import os

from taser.models.biencoder import BiEncoder
from taser.models.config import BiEncoderConfig
from taser.models.convert.dpr_state import base_encoder, read_dpr_checkpoint
from taser.models.convert.mapping import ConversionError, gather, listing
from taser.models.convert.output import check_output
from taser.models.convert.target import check_tokenizer, fill, is_pooler, new_model, tensor_shapes, write_checkpoint

SIDES = {"question_encoder.": "question_model.", "passage_encoder.": "ctx_model."}


def import_dpr_checkpoint(
    path: str | os.PathLike,
    output: str | os.PathLike,
    base_model: str | None = None,
    max_length: int | None = None,
    allow_pickle: bool = False,
    overwrite: bool = False,
) -> BiEncoder:
    """Write DPR's checkpoint `path` as a `dpr` checkpoint at `output` and return the model.

    `max_length` None: the file's `sequence_length`, else 256.
    """
    check_output(output, overwrite, (path,))
    checkpoint = read_dpr_checkpoint(path, allow_pickle)
    projection = [n for n in checkpoint.model_dict if ".encode_proj." in n]
    if checkpoint.encoder.get("projection_dim") or projection:
        raise ConversionError(
            f"{checkpoint.path}: the encoders project their [CLS] vectors (projection_dim={checkpoint.encoder.get('projection_dim')}"
            f"{', ' + listing(projection) if projection else ''}), which this library's dpr model does not have"
        )
    encoder_config, tokenizer, name = base_encoder(checkpoint, base_model)
    check_tokenizer(tokenizer, encoder_config, f"base_model {name}")
    length = checkpoint.max_length(max_length)
    config = BiEncoderConfig(
        model_type="dpr", pretrained=f"{checkpoint.path} (DPR checkpoint of {name})", pooling="cls", normalize=False, similarity="dot",
        max_length=length, max_question_length=length,
    )  # fmt: skip
    model = new_model(config, encoder_config)
    shapes = tensor_shapes(model)
    names = {n: theirs + n[len(ours) :] for n in shapes for ours, theirs in SIDES.items() if n.startswith(ours)}
    fill(model, gather(checkpoint.model_dict, names, shapes, str(checkpoint.path), optional=is_pooler))
    write_checkpoint(model, tokenizer, output, overwrite)
    return model
