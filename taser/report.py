"""Collect the results.json of any set of evaluation runs into one report: a paper-style markdown
table (systems x datasets, with parameter counts; several seeds of a system: mean ± std and n;
95% bootstrap intervals over questions; with baseline=..., paired significance marks, Holm-corrected)
and a top-k accuracy curve per dataset (PNG; the spread over seeds shaded). Reader runs
(`taser-read`) add EM@k columns beside their retriever's top-k.

`taser-report 'runs=[outputs/eval]' out_dir=outputs/report`
`taser-report 'runs=[outputs/eval]' "baseline='dpr (model=dpr/final)'"`  (quoted for the shell and for Hydra)
`taser-report 'runs=[outputs/experiments/squad_cpu]' baseline=dpr 'inspect=["taser T=2"]' inspect_k=5`  (an HTML page per system)
"""


import hydra

from taser.cli import CONFIG_DIR, setup_logging, typed_or_exit
from taser.command_help import run_command
from taser.evaluation.report import read_runs, write_report


@hydra.main(config_path=CONFIG_DIR, config_name="report", version_base="1.3")
def main(cfg) -> None:
    setup_logging()
    job = typed_or_exit(cfg)
    report = write_report(read_runs(job.runs), job.out_dir, job.ks, job.beir_metrics, job.title, job.stats_settings(), job.inspect, job.inspect_k)
    print(report["markdown"])


def command() -> None:
    """The console command (`taser-report`): `--help` lists its settings; a mistyped one is answered before Hydra reads it."""
    run_command(main, "report", __doc__)


if __name__ == "__main__":
    command()
