"""A rerun of a sweep, a driver restarted after it was lost, and two tables swept at once submit only
what is left and never wait inside an allocation: the jobs' ledger (`taser.pipeline.job_ledger`) and
a scheduled job's refusal to wait for a stage another live job builds."""

import json
import runpy
import socket
import subprocess
import sys
import threading
import time

import pytest
from conftest import ROOT
from test_experiment import SWEEP, job_of, records, squad4, tiny  # noqa: F401 - squad4 is a fixture

import taser.pipeline.stages as stages
from taser.pipeline import job_ledger
from taser.pipeline.stages import DONE_FILE, StageBusy, StageStore, process_start, stage_key


def _holder(seconds: float = 600) -> subprocess.Popen:
    """Another live process (reaped as soon as it exits, as a process of another job would be). The tests
    end it themselves when it should go: one that ends on a timer may end before a loaded machine reaches
    the step that must find it alive."""
    process = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})"])
    threading.Thread(target=process.wait, daemon=True).start()
    return process


def _lock_held_by(path, process: subprocess.Popen) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"host": socket.gethostname(), **stages._process_space(), "pid": process.pid, "start": process_start(process.pid),
                                "token": f"{socket.gethostname()}:{process.pid}:1"}))


def test_a_scheduled_job_does_not_wait_for_a_stage_another_live_job_builds(tmp_path):
    holder = _holder(60)
    try:
        key = stage_key("squad", {"a": 1}, {})
        _lock_held_by(tmp_path / (key + ".lock"), holder)
        began = time.perf_counter()
        with pytest.raises(StageBusy) as busy:
            StageStore(tmp_path, poll_s=0.01, wait=False).run("squad", {"a": 1}, {}, lambda d: pytest.fail("built beside its holder"))
        assert time.perf_counter() - began < 5 and busy.value.lock == str(tmp_path / (key + ".lock")) and busy.value.key == key
        import pickle

        again = pickle.loads(pickle.dumps(busy.value))  # as submitit sends it back to the driver
        assert (again.lock, again.key, str(again)) == (busy.value.lock, key, str(busy.value))
    finally:
        holder.kill()
        holder.wait()
    # its holder gone: taken over and built
    assert StageStore(tmp_path, poll_s=0.01, wait=False).run("squad", {"a": 1}, {}, lambda d: None).built


def test_a_jobs_ledger_says_finished_only_while_every_stage_it_used_is_done(squad4, tiny_pretrained, tmp_path):  # noqa: F811
    job = job_of(tiny(squad4, tiny_pretrained, tmp_path / "stages") + ["row=dpr", "seed=1"])
    assert not job_ledger.finished(job)
    for key in ("squad-1", "train-2"):
        (tmp_path / "stages" / key).mkdir(parents=True)
        (tmp_path / "stages" / key / DONE_FILE).write_text("{}")
    job_ledger.record_finished(job, ["squad-1", "train-2"])
    assert job_ledger.finished(job)
    elsewhere = job_of(tiny(squad4, tiny_pretrained, tmp_path / "stages") + ["row=dpr", "seed=1", "out_dir=/elsewhere", "progress=true",
                                                                              "scheduled=true"])
    assert job_ledger.job_key(elsewhere) == job_ledger.job_key(job) and job_ledger.finished(elsewhere)  # where it writes does not matter
    other = job_of(tiny(squad4, tiny_pretrained, tmp_path / "stages") + ["row=dpr", "seed=1", "table.train.learning_rate=0.5"])
    assert not job_ledger.finished(other)  # another recipe: another job
    (tmp_path / "stages" / "train-2" / DONE_FILE).unlink()
    assert not job_ledger.finished(job)


def test_a_job_run_twice_at_once_is_refused_and_the_driver_waits_for_the_first(squad4, tiny_pretrained, tmp_path):  # noqa: F811
    job = job_of(tiny(squad4, tiny_pretrained, tmp_path / "stages") + ["row=dpr", "seed=1"])
    _, lock = job_ledger._paths(job)
    holder = _holder()
    _lock_held_by(lock, holder)
    with pytest.raises(job_ledger.JobBusy, match="already running"), job_ledger.running(job):
        pytest.fail("ran beside the live one")
    began = time.perf_counter()
    threading.Timer(1.0, holder.kill).start()
    waiter = threading.Thread(target=job_ledger.wait_while_running, args=(job, 0.05), daemon=True)
    waiter.start()
    waiter.join(timeout=60)
    assert not waiter.is_alive(), "the driver still waits for a job whose process has ended"
    holder.wait()
    assert time.perf_counter() - began > 0.5 and not lock.exists()  # waited for it; then its dead holder's lock was cleared


def test_the_driver_clears_a_lock_it_saw_unchanged_past_the_stale_limit(tmp_path, lock_clock):
    lock = tmp_path / "jobs" / "x.lock"
    lock.parent.mkdir()
    lock.write_text(json.dumps({"host": "a-lost-node", "pid": 1, "token": "a-lost-node:1:1"}))
    waiter = threading.Thread(target=job_ledger.wait_for_lock, args=(lock, 0.01, 300.0), daemon=True)
    waiter.start()
    time.sleep(0.3)
    assert waiter.is_alive() and lock.exists()  # seen unchanged for 0 s of the driver's clock
    lock_clock.advance(301)
    waiter.join(timeout=10)
    assert not waiter.is_alive() and not lock.exists()


@pytest.mark.slow
def test_a_sweep_whose_stage_another_live_job_builds_waits_in_the_driver_and_runs_the_job_again(squad4, tiny_pretrained, tmp_path,  # noqa: F811
                                                                                                  monkeypatch, capfd):
    """Two tables swept at once share a stage: here its lock is held by another live process (a table
    swept beside this one) for a few seconds. The sweep's job must fail at once rather than wait in its
    allocation; the driver waits for the lock and runs the job again, which then builds or finds it."""
    import hydra_plugins.taser_table_sweeper.table_sweeper as sweeper
    from taser.pipeline.rows import RowRun

    overrides = tiny(squad4, tiny_pretrained, tmp_path / "stages", seeds=(1,))

    class KeyOnly(StageStore):
        class Found(Exception):
            pass

        def run(self, kind, settings, inputs, build):
            raise self.Found(stage_key(kind, settings, inputs))

    with pytest.raises(KeyOnly.Found) as found:
        RowRun(job_of(overrides + ["row=dpr"]), KeyOnly(tmp_path / "scratch")).data()
    holder = _holder()
    _lock_held_by(tmp_path / "stages" / (found.value.args[0] + ".lock"), holder)
    monkeypatch.setattr(sweeper, "POLL_S", 0.1)
    waits = sweeper.TableSweeper._wait_for

    def holder_ends_while_the_driver_waits(lock):
        threading.Timer(0.5, holder.kill).start()
        waits(lock)

    monkeypatch.setattr(sweeper.TableSweeper, "_wait_for", staticmethod(holder_ends_while_the_driver_waits))
    sweep = tmp_path / "sweep"
    monkeypatch.setattr(sys, "argv", ["experiment.py", "-m", *overrides, "row=bm25", f"hydra.sweep.dir={sweep}"])
    try:
        runpy.run_path(str(ROOT / "scripts" / "experiment.py"), run_name="__main__")
    finally:
        holder.kill()
        holder.wait()
    logged = capfd.readouterr()
    assert "bm25 seed 1 met a stage another live job builds" in logged.out + logged.err
    assert ("bm25", 1) in records(sweep)
    assert all(s["waited_s"] == 0.0 for r in records(sweep).values() for s in r["stages"])  # no job waited on a lock
