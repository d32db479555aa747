"""The conversions there are, and the settings each one takes (light: no torch, so config
schemas can name them)."""

from __future__ import annotations

from taser.choice import Choice


class Conversion(Choice):
    import_hf_dpr = "import_hf_dpr"  # DPRQuestionEncoder + DPRContextEncoder directories -> dpr
    import_dpr_cp = "import_dpr_cp"  # DPR's own .cp checkpoint -> dpr
    import_taser = "import_taser"  # TASER's released pytorch_model.bin -> taser
    export_hf_dpr = "export_hf_dpr"  # dpr -> DPRQuestionEncoder + DPRContextEncoder directories
    export_sentence_transformers = "export_sentence_transformers"  # shared or dpr -> a sentence-transformers directory
    export_taser = "export_taser"  # taser -> TASER's layout (pytorch_model.bin)
    import_dpr_reader = "import_dpr_reader"  # DPR's reader .cp -> a reader checkpoint (scripts/read.py)

    @property
    def imports(self) -> bool:
        return self.value.startswith("import_")


NEEDS_CTX_SOURCE = {Conversion.import_hf_dpr}
TAKES_BASE_MODEL = {Conversion.import_dpr_cp, Conversion.import_taser, Conversion.export_taser, Conversion.import_dpr_reader}
NEEDS_BASE_MODEL = {Conversion.export_taser}  # written into the file as pretrained_model_cfg, which TASER's code builds from
# export_taser: the transformers version that will load the file. TASER's environment.yml pins 4.12.5, whose BERT
# saves (and strictly loads) `embeddings.position_ids`; from 4.31 on that buffer is not saved, and a file holding it
# is refused as unexpected.
TASER_PINNED_TRANSFORMERS = "4.12.5"
POSITION_IDS_DROPPED_IN = (4, 31)


def saves_position_ids(transformers_version: str) -> bool:
    """Whether BERT's state dict holds `embeddings.position_ids` in this transformers version (before 4.31)."""
    try:
        major, minor = (int(part) for part in str(transformers_version).split(".")[:2])
    except ValueError:
        raise ValueError(f"target_transformers must be a version such as {TASER_PINNED_TRANSFORMERS} or 4.44, "
                         f"got {transformers_version!r}") from None
    return (major, minor) < POSITION_IDS_DROPPED_IN


def check_arguments(conversion: Conversion | str, ctx_source=None, base_model=None, max_length=None, allow_pickle: bool = False,
                    target_transformers: str | None = None) -> Conversion:
    """The conversion, after refusing any setting it would not use (settings are never ignored)."""
    conversion = Conversion.parse(conversion, "conversion")
    if (ctx_source is not None) != (conversion in NEEDS_CTX_SOURCE):
        raise ValueError(f"ctx_source (the DPRContextEncoder directory) is needed by import_hf_dpr, and only by it (conversion={conversion})")
    if base_model is not None and conversion not in TAKES_BASE_MODEL:
        raise ValueError(f"base_model applies to {', '.join(sorted(TAKES_BASE_MODEL))}, not to conversion={conversion} (its source brings its config)")
    if not base_model and conversion in NEEDS_BASE_MODEL:
        raise ValueError(
            f"conversion={conversion} needs base_model=<hub name of the BERT model the checkpoint was trained from, e.g. bert-base-uncased>: "
            "TASER's code builds the encoder and tokenizer from that name (encoder_params.pretrained_model_cfg)"
        )
    for name, value in (("max_length", max_length), ("allow_pickle", allow_pickle or None)):
        if value is not None and not conversion.imports:
            raise ValueError(f"{name} applies to imports, not to conversion={conversion}")
    if target_transformers is not None:
        if conversion != Conversion.export_taser:
            raise ValueError(f"target_transformers applies to export_taser, not to conversion={conversion}")
        saves_position_ids(target_transformers)
    if max_length is not None and (not isinstance(max_length, int) or isinstance(max_length, bool) or max_length < 2):
        raise ValueError(f"max_length must be an integer >= 2 (or null), got {max_length!r}")
    return conversion
