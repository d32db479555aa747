"""A sweep checked whole before its first job: `scripts/experiment.py -m ...` composes every job of
the sweep (the table's own `hydra.sweeper.params` and the command line's, expanded as Hydra's
basic sweeper expands them) and checks each as its job would, before Hydra hands any of them to a
launcher. A typo in one row of `row=dpr,nope` is refused in seconds, whatever the launcher (basic,
joblib, submitit), instead of when its job comes up hours later.

It uses Hydra's own parser and config loader, so a job composes here exactly as it will there.
"""

from __future__ import annotations

import sys
import time

from taser.cli import CONFIG_DIR, typed


class SweepRefused(ValueError):
    """Some jobs of a sweep would fail: the message lists each with its overrides and error."""


def sweep_jobs(overrides: list[str], config_name: str) -> list[tuple[list[str], object]]:
    """[(the job's sweep overrides, its typed config or the exception composing it raised)] for every job."""
    from hydra import initialize_config_dir
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.types import RunMode

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3", job_name=config_name):
        loader = GlobalHydra.instance().config_loader()
        master = loader.load_configuration(config_name, overrides, run_mode=RunMode.MULTIRUN)
        params = [f"{key}={value}" for key, value in (master.hydra.sweeper.params or {}).items()] + list(overrides)
        parser = OverridesParser.create(config_loader=loader)
        jobs = [list(job) for job in BasicSweeper.split_arguments(parser.parse_overrides(params), None)[0]]
        return compose_jobs(loader, master, jobs)


def compose_jobs(loader, master, jobs: list[list[str]]) -> list[tuple[list[str], object]]:
    """Each job's overrides composed over the sweep's `master` config and typed (or the exception).

    Jobs that choose the same config groups (`table=...`) are composed once; each job's other
    overrides are then applied to a copy, as Hydra applies them after composing (and 45 jobs take
    a second instead of ten)."""
    import copy

    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import open_dict

    parser = OverridesParser.create(config_loader=loader)
    out, composed = [], {}
    for job in jobs:
        try:
            parsed = parser.parse_overrides(job)
            groups = tuple(o.input_line for o in parsed if loader.repository.group_exists(o.key_or_group))
            if groups not in composed:
                composed[groups] = loader.load_sweep_config(master, list(groups))
            cfg = copy.deepcopy(composed[groups])
            ConfigLoaderImpl._apply_overrides_to_config([o for o in parsed if o.input_line not in groups], cfg)
            with open_dict(cfg):
                del cfg["hydra"]
                if "out_dir" in cfg:
                    cfg.out_dir = "sweep-check"  # the launcher sets each job's own
            out.append((job, typed(cfg)))
        except Exception as error:  # noqa: BLE001 - each job's failure is reported, whatever it is
            out.append((job, error))
    return out


def check_sweep(argv: list[str], config_name: str = "experiment") -> int:
    """Check every job of a `-m` command line; the number of jobs (0 when `argv` is not a sweep that
    launches). Raises SweepRefused naming each job that would fail."""
    from hydra._internal.utils import get_args_parser

    args = get_args_parser().parse_args(argv)
    if not args.multirun or args.cfg or args.info or args.help or args.hydra_help or args.shell_completion:
        return 0
    start = time.perf_counter()
    jobs = sweep_jobs(args.overrides, args.config_name or config_name)
    failed = [(job, result) for job, result in jobs if isinstance(result, Exception)]
    if failed:
        by_error: dict[str, list[str]] = {}
        for job, error in failed:
            by_error.setdefault(f"{type(error).__name__}: {error}".strip(), []).append(" ".join(job))
        lines = []
        for error, where in by_error.items():
            shown = "; ".join(where[:3]) + (f"; and {len(where) - 3} more" if len(where) > 3 else "")
            lines.append(f"- {error}\n  (job{'s' if len(where) > 1 else ''}: {shown})")
        raise SweepRefused(f"{len(failed)} of the sweep's {len(jobs)} jobs would fail, so none was started "
                           f"(checked in {time.perf_counter() - start:.1f} s):\n" + "\n".join(lines))
    return len(jobs)


def check_sweep_or_exit(argv: list[str] | None = None, config_name: str = "experiment") -> None:
    """For a script's `__main__`: print why the sweep is refused and exit 2 before Hydra starts."""
    try:
        check_sweep(sys.argv[1:] if argv is None else argv, config_name)
    except SweepRefused as refused:
        print(f"Error: {refused}", file=sys.stderr)
        sys.exit(2)
