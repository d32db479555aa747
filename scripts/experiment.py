"""One (row, seed) of a paper's table per job; `-m` runs the table's sweep (see configs/experiment.yaml).

    python scripts/experiment.py -m table=squad_cpu
    python scripts/experiment.py table=squad_cpu row=dpr seed=2
"""

import _environment  # noqa: F401  (first: a Python without taser's environment is told how to get it)
import hydra

from taser.cli import CONFIG_DIR, exit_on_sigterm, setup_logging, typed


@hydra.main(config_path=CONFIG_DIR, config_name="experiment", version_base="1.3")
def main(cfg) -> None:
    setup_logging()
    job = typed(cfg)  # a typo in a row's name is refused here, before anything loads
    exit_on_sigterm()  # not under submitit, which handles SIGTERM itself
    from taser.pipeline.rows import run_row

    run_row(job)


if __name__ == "__main__":
    from taser.sweeps.check import check_sweep_or_exit

    check_sweep_or_exit()  # every job of a -m sweep composed and checked before the first starts
    main()
