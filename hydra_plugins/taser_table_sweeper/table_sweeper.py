"""The sweeper of a paper's table (`hydra/sweeper=table`, scripts/experiment.py's default): Hydra's
basic sweeper, with the sweep's jobs launched in waves (`taser.sweeps.schedule`) so that no job
waits in an allocation for a stage another job builds, and each class of job on its own resources:

- `cpu` (prepare jobs, BM25 rows) and `evaluate` (jobs that train nothing) take, on a SLURM launcher,
  the sweep's launcher settings with `launchers.<class>` over them, GPUs, CPUs, memory and time never
  above the sweep's (a class job fits wherever the sweep's jobs fit);
  `train` jobs take the sweep's launcher as given; local launchers run every class as they are;
- a wave's classes are launched at once on SLURM (each a job array), one after another locally;
- a failed job stops only the jobs that need its stages; the sweep then fails, naming them;
- a job that finished before (a rerun, a driver restarted after it was lost) is not submitted again,
  and one that a live job is running is waited for here, not submitted twice
  (`taser.pipeline.job_ledger`); each job is launched with `scheduled=true`: it builds only its own
  row's stages and, rather than wait inside its allocation for a stage another live job builds (a
  table swept beside this one), fails at once; the driver waits for that stage and runs it again.

The schedule is logged and written to `schedule.json` in the sweep's directory.
"""

from __future__ import annotations

import copy
import json
import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.plugins import Plugins
from hydra.core.utils import JobStatus
from omegaconf import OmegaConf, open_dict

log = logging.getLogger(__name__)


CAPPED = ("gpus_per_node", "cpus_per_task", "mem_gb", "timeout_min")
BUSY_RETRIES = 5  # how many times a job that found its stage being built elsewhere is run again after the wait
POLL_S = 10.0  # the driver's look at a lock it waits for


class SweepFailed(RuntimeError):
    """Jobs of the sweep failed (and the jobs that needed their stages were not started)."""


class TableSweeper(BasicSweeper):
    def __init__(self, max_batch_size: int | None = None, params: dict | None = None, launchers: dict | None = None, waves: bool = True) -> None:
        super().__init__(max_batch_size=max_batch_size, params=params)
        self.launchers = {k: dict(v or {}) for k, v in (OmegaConf.to_container(launchers) if OmegaConf.is_config(launchers) else launchers or {}).items()}
        self.waves = waves
        self.task_function = None

    def setup(self, *, hydra_context, task_function, config) -> None:
        super().setup(hydra_context=hydra_context, task_function=task_function, config=config)
        self.task_function = task_function

    def sweep(self, arguments: list[str]) -> Any:
        if not self.waves:
            return super().sweep(arguments)
        from taser.sweeps.check import compose_jobs
        from taser.sweeps.schedule import schedule

        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        overrides = [list(job) for job in self.split_arguments(parser.parse_overrides(self._parse_config() + list(arguments)), None)[0]]
        composed = compose_jobs(self.hydra_context.config_loader, self.config, overrides)
        failed = [f"{' '.join(job)}: {result}" for job, result in composed if isinstance(result, Exception)]
        if failed:
            raise SweepFailed("jobs of the sweep do not compose:\n" + "\n".join(failed))
        plan = schedule(composed)
        sweep_dir = Path(self.config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        (sweep_dir / "schedule.json").write_text(json.dumps(plan.record(), indent=2))
        log.info("the sweep's %d jobs in %d waves:\n%s", len(plan.jobs), len(plan.waves()), plan.describe())

        slurm = "slurm" in str(self.config.hydra.launcher.get("_target_", "")).lower()
        launchers = {klass: self._launcher(klass if slurm else None) for klass in ("cpu", "train", "evaluate")}
        status: dict[int, bool] = {}  # job index -> succeeded
        errors: dict[int, str] = {}  # job index -> why it failed
        returns, next_idx = [], 0
        for number, wave in enumerate(plan.waves()):
            batches = []
            for klass, indices in wave.items():
                runnable = [i for i in indices if all(status.get(n) for n in plan.jobs[i].needs)]
                for i in set(indices) - set(runnable):
                    status[i] = False
                    log.error(
                        "not started: %s (it needs the stages of %s, which failed)",
                        plan.jobs[i].name,
                        ", ".join(plan.jobs[n].name for n in plan.jobs[i].needs if not status.get(n)),
                    )
                runnable = self._left_to_run(plan, runnable, status)
                if runnable:
                    batches.append((klass, runnable))
            log.info("wave %d: %s", number, "; ".join(f"{len(ids)} {klass} job(s)" for klass, ids in batches) or "nothing to start")
            for attempt in range(1 + BUSY_RETRIES):
                numbered = []
                for klass, indices in batches:
                    numbered.append((klass, indices, next_idx))
                    next_idx += len(indices)

                def launch(batch, launchers=launchers, plan=plan):
                    return _launch(launchers[batch[0]], batch, [[*plan.jobs[i].overrides, "scheduled=true"] for i in batch[1]])

                if slurm and len(numbered) > 1:  # separate SLURM arrays: waited for side by side
                    with ThreadPoolExecutor(len(numbered)) as pool:
                        outcomes = list(pool.map(launch, numbered))
                else:  # local launchers run jobs in this process (basic) or its pool: one batch at a time
                    outcomes = [launch(b) for b in numbered]
                busy: dict[str, list[int]] = {}  # klass -> jobs to run again once the lock they met is released
                for (klass, indices, _), results, error in outcomes:
                    if error is not None:
                        log.error("the %s jobs %s were lost: %s", klass, ", ".join(plan.jobs[i].name for i in indices), error)
                        status.update({i: False for i in indices})
                        errors.update({i: f"lost: {type(error).__name__}: {error}" for i in indices})
                        continue
                    for i, result in zip(indices, results):
                        status[i] = result.status == JobStatus.COMPLETED
                        if not status[i]:
                            try:
                                result.return_value  # noqa: B018 - raises the job's exception
                            except Exception as failure:  # noqa: BLE001
                                lock = getattr(failure, "lock", None)
                                if lock is not None and attempt < BUSY_RETRIES:  # StageBusy, JobBusy: met another live job
                                    log.info("%s met a stage another live job builds: waiting for it here, then running it again (%s)",
                                             plan.jobs[i].name, failure)
                                    self._wait_for(lock)
                                    busy.setdefault(klass, []).append(i)
                                    status.pop(i)
                                    continue
                                errors[i] = f"{type(failure).__name__}: {failure}"
                                log.error("job failed: %s: %s", plan.jobs[i].name, errors[i])
                    returns.append(results)
                batches = [(klass, self._left_to_run(plan, ids, status)) for klass, ids in busy.items()]
                batches = [(klass, ids) for klass, ids in batches if ids]
                if not batches:
                    break
        failures = [plan.jobs[i].name for i, ok in sorted(status.items()) if not ok]
        if failures:
            reasons = "".join(f"\n- {plan.jobs[i].name}: {error}" for i, error in sorted(errors.items()))
            raise SweepFailed(f"{len(failures)} of the sweep's {len(plan.jobs)} jobs failed or were not started: {', '.join(failures)} (the "
                              f"others not started need their stages). Rerun the same command: every finished stage is found.{reasons}")
        return returns

    def _left_to_run(self, plan, indices: list[int], status: dict[int, bool]) -> list[int]:
        """The jobs of `indices` to submit: not those a live job is running (waited for here first) nor
        those that finished before with every stage still done (marked succeeded)."""
        from taser.pipeline.job_ledger import finished, wait_while_running

        left = []
        for i in indices:
            job = plan.jobs[i].job
            wait_while_running(job, POLL_S)
            if finished(job):
                log.info("found done, not submitted: %s", plan.jobs[i].name)
                status[i] = True
            else:
                left.append(i)
        return left

    @staticmethod
    def _wait_for(lock: str) -> None:
        from taser.pipeline.job_ledger import wait_for_lock

        wait_for_lock(lock, POLL_S)

    def _launcher(self, klass: str | None):
        """The sweep's launcher, or for a job class on SLURM that launcher with `launchers.<class>` over it."""
        overrides = dict(self.launchers.get(klass) or {}) if klass else {}
        if not overrides:
            return self.launcher
        config = copy.deepcopy(self.config)
        with open_dict(config):
            for key in CAPPED:  # never more than the sweep's launcher asks for: a class job must fit where the sweep's jobs fit
                given = config.hydra.launcher.get(key)
                if key in overrides and isinstance(given, int | float) and not isinstance(given, bool):
                    overrides[key] = min(overrides[key], given)
            for key, value in overrides.items():
                config.hydra.launcher[key] = value
        return Plugins.instance().instantiate_launcher(hydra_context=self.hydra_context, task_function=self.task_function, config=config)


def _launch(launcher, batch: tuple, overrides: list[list[str]]):
    try:
        return batch, launcher.launch(overrides, initial_job_idx=batch[2]), None
    except Exception as error:  # noqa: BLE001 - a lost batch (a cancelled array): its jobs failed, the others go on
        return batch, None, error
