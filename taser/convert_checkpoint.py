"""Convert a checkpoint between this library's directory and DPR's or TASER's released layouts.

`taser-convert-checkpoint conversion=import_hf_dpr source=dpr-question_encoder-single-nq-base
    ctx_source=dpr-ctx_encoder-single-nq-base output=outputs/converted/dpr-single-nq`
`taser-convert-checkpoint conversion=import_taser source=taser-bert-base-uncased/pytorch_model.bin
    base_model=bert-base-uncased allow_pickle=true output=outputs/converted/taser-bert-base`
`taser-convert-checkpoint conversion=export_sentence_transformers source=outputs/train/shared/final output=...`
`taser-convert-checkpoint conversion=import_dpr_reader source=checkpoint.reader.nq-single.hf-bert-base.cp
    base_model=bert-base-uncased allow_pickle=true output=outputs/converted/dpr-reader-nq`
"""


import hydra

from taser.cli import CONFIG_DIR, setup_logging, typed_or_exit
from taser.command_help import run_command
from taser.pipeline.convert import convert_checkpoint


@hydra.main(config_path=CONFIG_DIR, config_name="convert_checkpoint", version_base="1.3")
def main(cfg) -> None:
    setup_logging()
    job = typed_or_exit(cfg)
    out = convert_checkpoint(job.conversion, job.source, job.output, job.ctx_source, job.base_model, job.max_length, job.allow_pickle, job.overwrite,
                             job.target_transformers)
    print(out)


def command() -> None:
    """The console command (`taser-convert-checkpoint`): `--help` lists its settings; a mistyped one is answered before Hydra reads it."""
    run_command(main, "convert_checkpoint", __doc__)


if __name__ == "__main__":
    command()
