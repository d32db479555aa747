"""Encode a passages TSV with a checkpoint's passage encoder, one contiguous shard per call.

`taser-encode-passages checkpoint=outputs/train/dpr/final shard_id=0 num_shards=50`
`torchrun --nproc_per_node=8 -m taser.encode_passages checkpoint=...`  (one shard per rank)
Re-running a killed command continues from its last complete chunk.
"""


import hydra

from taser.cli import CONFIG_DIR, checkpoint_or_exit, inputs_or_exit, setup_logging, typed_or_exit
from taser.command_help import run_command
from taser.pipeline.encode import encode_corpus


@hydra.main(config_path=CONFIG_DIR, config_name="encode_passages", version_base="1.3")
def main(cfg) -> None:
    setup_logging()
    job = typed_or_exit(cfg)
    inputs_or_exit({"passages": job.passages})
    encode_corpus(checkpoint_or_exit(job.checkpoint), job.passages, job.out_dir, job.shard_id, job.num_shards, job.batch_size, job.precision, job.chunk_size,
                  job.device, dtype=job.dtype, offsets_cache=job.offsets_cache, backend=job.backend)


def command() -> None:
    """The console command (`taser-encode-passages`): `--help` lists its settings; a mistyped one is answered before Hydra reads it."""
    run_command(main, "encode_passages", __doc__)


if __name__ == "__main__":
    command()
