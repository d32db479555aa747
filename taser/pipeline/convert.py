"""Stage: convert a checkpoint between this library's directory and another project's layout
(`taser.models.convert`), callable from Python; `scripts/convert_checkpoint.py` is its shell."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from taser.models.convert.conversions import Conversion, check_arguments
from taser.models.convert.dpr_original import import_dpr_checkpoint
from taser.models.convert.hf_dpr import export_hf_dpr, import_hf_dpr
from taser.models.convert.output import conversion_progress
from taser.models.convert.sentence_transformers_dir import export_sentence_transformers
from taser.models.convert.taser_release import export_taser_release, import_taser_release
from taser.reader.convert import import_dpr_reader

log = logging.getLogger(__name__)


def convert_checkpoint(
    conversion: Conversion | str,
    source: str | os.PathLike,
    output: str | os.PathLike,
    ctx_source: str | os.PathLike | None = None,
    base_model: str | None = None,
    max_length: int | None = None,
    allow_pickle: bool = False,
    overwrite: bool = False,
    target_transformers: str | None = None,
) -> Path:
    """Run one conversion; the output path. An import writes a checkpoint directory that
    `load_checkpoint` (and so `encode_passages` and `evaluate`) reads, or, for `import_dpr_reader`,
    a reader directory that `scripts/read.py` reads; an export reads one.
    A setting the conversion does not use is refused (`check_arguments`)."""
    conversion = check_arguments(conversion, ctx_source, base_model, max_length, allow_pickle, target_transformers)
    with conversion_progress(str(conversion), STEPS[conversion]):
        _convert(conversion, source, output, ctx_source, base_model, max_length, allow_pickle, overwrite, target_transformers)
    log.info("%s: %s -> %s", conversion, source, output)
    return Path(output)


# the steps each conversion reports (`taser.models.convert.output.step`): read (each source file), map, write
STEPS = {Conversion.import_hf_dpr: 4, Conversion.import_dpr_cp: 3, Conversion.import_taser: 3,
         Conversion.export_hf_dpr: 2, Conversion.export_sentence_transformers: 2, Conversion.export_taser: 2,
         Conversion.import_dpr_reader: 3}  # fmt: skip


def _convert(conversion: Conversion, source, output, ctx_source, base_model, max_length, allow_pickle, overwrite, target_transformers) -> None:
    if conversion == Conversion.import_hf_dpr:
        import_hf_dpr(source, ctx_source, output, max_length=max_length, overwrite=overwrite, allow_pickle=allow_pickle)
    elif conversion == Conversion.import_dpr_cp:
        import_dpr_checkpoint(source, output, base_model=base_model, max_length=max_length, allow_pickle=allow_pickle, overwrite=overwrite)
    elif conversion == Conversion.import_taser:
        import_taser_release(source, output, base_model=base_model, max_length=max_length, allow_pickle=allow_pickle, overwrite=overwrite)
    elif conversion == Conversion.export_hf_dpr:
        export_hf_dpr(source, output, overwrite=overwrite)
    elif conversion == Conversion.import_dpr_reader:
        import_dpr_reader(source, output, base_model=base_model, max_length=max_length, allow_pickle=allow_pickle, overwrite=overwrite)
    elif conversion == Conversion.export_sentence_transformers:
        export_sentence_transformers(source, output, overwrite=overwrite)
    else:
        export_taser_release(source, output, base_model=base_model, overwrite=overwrite, target_transformers=target_transformers)
