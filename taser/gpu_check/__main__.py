"""`make gpu-check`: train DPR and TASER a few steps at two sizes on this machine's GPU (then on all
of its GPUs under torchrun), check the loss against the CPU in fp32, measure training and encoding
speed; writes outputs/gpu_check/results.md and results.json. Exits 1 on any failure.

Dry run on a CPU: taser-gpu-check scale=dry_run
"""

import sys

import hydra

from taser.cli import CONFIG_DIR, setup_logging, typed_or_exit
from taser.command_help import run_command
from taser.gpu_check import GpuCheckFailed, run_gpu_check
from taser.gpu_check.job import register_schema

register_schema()


@hydra.main(config_path=CONFIG_DIR, config_name="gpu_check", version_base="1.3")
def main(cfg) -> None:
    setup_logging()
    try:
        results = run_gpu_check(typed_or_exit(cfg))
    except GpuCheckFailed as e:
        print(e, file=sys.stderr)
        sys.exit(1)
    print(f"GPU check passed: {cfg.out_dir}/results.md ({results['machine']}, {results['precision']})")


def command() -> None:
    """The console command (`taser-gpu-check`): `--help` lists its settings; a mistyped one is answered before Hydra reads it."""
    run_command(main, "gpu_check", __doc__)


if __name__ == "__main__":
    command()
