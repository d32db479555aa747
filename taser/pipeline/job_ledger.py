"""What a table's jobs have done and are doing, read by the sweep's driver before it submits anything.

Each job of a table (a row at a seed, or its prepare job) has a key: a hash of its whole typed config
but where it writes its files and how it reports progress. In `<stages_dir>/jobs/`:
- `<key>.json`, written when the job ends: the stages it used (every one of them done then);
- `<key>.lock`, held while a job scheduled by a sweep runs (a stage lock: heartbeat, staleness, takeover).

A rerun of a sweep, or a driver restarted after it was lost, submits only the jobs that are not
finished (no record, or a stage of its record no longer done) and that no live job is running (it
waits for those in the driver, outside any allocation, and then looks again).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

from taser.io import atomic_open
from taser.pipeline.stages import DONE_FILE, STALE_AFTER_S, _FileLock

log = logging.getLogger(__name__)

JOBS_DIR = "jobs"
VOLATILE = ("out_dir", "progress", "scheduled")  # where a job writes and how it reports: the same job either way


class JobBusy(RuntimeError):
    """This job is already running elsewhere (a sweep rerun while its first driver's jobs still run)."""

    def __init__(self, lock: str, holder: str):
        super().__init__(f"this job is already running ({holder}; lock {lock}): not run twice")
        self.lock, self.holder = lock, holder

    def __reduce__(self):
        return JobBusy, (self.lock, self.holder)


def job_key(job) -> str:
    """`<table>-<row>-seed<seed>[-prepare]-<12 hex digits>` of the job's config (but VOLATILE)."""
    config = {k: v for k, v in asdict(job).items() if k not in VOLATILE}
    digest = hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:12]
    phase = "" if str(job.phase) == "row" else f"-{job.phase}"
    return f"{job.table.name}-{job.row}-seed{job.seed}{phase}-{digest}"


def _paths(job) -> tuple[Path, Path]:
    base = Path(job.stages_dir) / JOBS_DIR / job_key(job)
    return base.with_suffix(".json"), base.with_suffix(".lock")


def record_finished(job, stage_keys: list[str]) -> None:
    record, _ = _paths(job)
    record.parent.mkdir(parents=True, exist_ok=True)
    with atomic_open(record) as f:
        json.dump({"job": job_key(job), "row": job.row, "seed": job.seed, "phase": str(job.phase), "stages": stage_keys,
                   "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z")}, f, indent=2)


def finished(job) -> bool:
    """Whether the job ran to its end and every stage it used is still done."""
    record, _ = _paths(job)
    try:
        stages = json.loads(record.read_text())["stages"]
    except (OSError, ValueError, KeyError):
        return False
    root = Path(job.stages_dir)
    return all((root / key / DONE_FILE).is_file() for key in stages)


@contextlib.contextmanager
def running(job) -> Iterator[None]:
    """Hold the job's lock while it runs; JobBusy at once when a live process holds it."""
    from taser.pipeline.stages import StageBusy

    _, path = _paths(job)
    lock = _FileLock(path, poll_s=1.0, stale_after_s=None, wait=False)
    try:
        lock.__enter__()
    except StageBusy as busy:
        raise JobBusy(busy.lock, busy.holder) from None
    try:
        yield
    finally:
        lock.__exit__(None, None, None)


def wait_for_lock(path: str | Path, poll_s: float = 10.0, stale_after_s: float | None = None, what: str = "") -> None:
    """Wait (in the driver) until a lock is released, or judged stale from this process's own observations
    (then it is taken away, so that the job submitted next does not wait for it); looked at after 0.1 s,
    then twice as long each time, up to every `poll_s`."""
    path = Path(path)
    observer = _FileLock(path, poll_s, stale_after_s)
    start, told, look = time.monotonic(), False, 0
    while path.exists():
        if observer._break_if_stale():
            return
        if not told:
            log.info("waiting for %s (held by %s)%s", path, observer._owner().get("token") or "?", f": {what}" if what else "")
            told = True
        time.sleep(min(poll_s, 0.1 * 2**look))  # a stage of seconds is not waited for 10 s; a long one is looked at every poll_s
        look += 1
    if told:
        log.info("%s released after %.0f s", path, time.monotonic() - start)


def wait_while_running(job, poll_s: float = 10.0, stale_after_s: float | None = None) -> None:
    _, lock = _paths(job)
    wait_for_lock(lock, poll_s, STALE_AFTER_S if stale_after_s is None else stale_after_s, what=f"{job.row} seed {job.seed} runs")
