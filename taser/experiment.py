"""One (row, seed) of a paper's table per job; `-m` runs the table's sweep (see configs/experiment.yaml).

    taser-experiment -m table=squad_cpu
    taser-experiment table=squad_cpu row=dpr seed=2
"""


import hydra

from taser.cli import CONFIG_DIR, exit_on_sigterm, setup_logging, typed_or_exit
from taser.command_help import run_command


@hydra.main(config_path=CONFIG_DIR, config_name="experiment", version_base="1.3")
def run_job(cfg) -> None:
    setup_logging()
    job = typed_or_exit(cfg)  # a typo in a row's name is refused here, before anything loads
    exit_on_sigterm()  # not under submitit, which handles SIGTERM itself
    from taser.pipeline.rows import run_row

    run_row(job)


def command() -> None:
    """The console command (`taser-experiment`): `--help` lists its settings; a mistyped one is answered before Hydra reads it, and every job of a
    `-m` sweep is composed and checked before the first starts."""
    from taser.sweeps.check import check_sweep_or_exit

    def checked_then_run() -> None:
        check_sweep_or_exit()
        run_job()

    run_command(checked_then_run, "experiment", __doc__)


if __name__ == "__main__":
    command()
