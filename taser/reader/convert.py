"""DPR's released reader checkpoint (`.cp`, e.g. `checkpoint.reader.nq-single.hf-bert-base`) to a
reader checkpoint directory.

The file is DPR's training checkpoint layout (`taser.models.convert.dpr_state`): a torch-saved
dict whose `model_dict` holds the BERT encoder as `encoder.*` (DPR's `HFBertEncoder`, a
`BertModel`: `encoder.embeddings.*`, `encoder.encoder.layer.*`, `encoder.pooler.*`),
`qa_outputs.*` and `qa_classifier.*`: this library's `Reader` names, one to one. The pooler, which
no logit uses, is dropped. The BERT config and tokenizer come from the model DPR started from
(`encoder_params`' `pretrained_model_cfg`, or `base_model`).
"""

from __future__ import annotations

import os

from taser.models.convert.dpr_state import base_encoder, read_dpr_checkpoint
from taser.models.convert.mapping import gather
from taser.models.convert.output import check_output, output_dir, step
from taser.models.convert.target import check_tokenizer, is_pooler, tensor_shapes
from taser.reader.model import Reader, ReaderConfig


def import_dpr_reader(
    path: str | os.PathLike,
    output: str | os.PathLike,
    base_model: str | None = None,
    max_length: int | None = None,
    max_question_length: int = 64,
    allow_pickle: bool = False,
    overwrite: bool = False,
) -> Reader:
    """Write DPR's reader checkpoint `path` as a reader checkpoint at `output` and return the reader.

    `max_length` None: the file's `sequence_length` (DPR's readers: 350), else 256.
    """
    check_output(output, overwrite, (path,))
    checkpoint = read_dpr_checkpoint(path, allow_pickle)
    encoder_config, tokenizer, name = base_encoder(checkpoint, base_model)
    check_tokenizer(tokenizer, encoder_config, f"base_model {name}")
    config = ReaderConfig(checkpoint.max_length(max_length), max_question_length, f"{checkpoint.path} (DPR reader of {name})")
    model = Reader.from_encoder_config(encoder_config, config)
    source = {n: t for n, t in checkpoint.model_dict.items() if not is_pooler(n)}  # no logit uses the pooler
    shapes = tensor_shapes(model)
    model.load_state_dict(gather(source, {n: n for n in shapes}, shapes, str(checkpoint.path)), strict=True)
    step("map the tensors")
    with output_dir(output, overwrite) as tmp:
        model.save_into(tmp, tokenizer)
    step(f"write {output}")
    return model
