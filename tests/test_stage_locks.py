"""The stage lock's liveness (issue 44, item 7 and item 10's pause): a heartbeat that survives an
NFS hiccup, a holder that checks its token before marking a stage done, a lock left empty by a kill
that goes stale, and a paused holder on this host that keeps its lock however long it sleeps."""

import json
import os
import signal
import socket
import subprocess
import threading
import time

import pytest

import taser.pipeline.stages as stages
from taser.pipeline.stages import DONE_FILE, LockLost, StageStore, _FileLock, process_start


def test_the_heartbeat_goes_on_after_a_failed_touch(tmp_path, monkeypatch):
    monkeypatch.setattr(stages, "HEARTBEAT_S", 0.02)
    real_utime, calls = os.utime, []

    def flaky(path, *args, **kwargs):
        calls.append(time.time())
        if len(calls) == 1:
            raise OSError("Stale file handle")  # an NFS hiccup
        return real_utime(path, *args, **kwargs)

    monkeypatch.setattr(stages.os, "utime", flaky)
    with _FileLock(tmp_path / "x.lock", poll_s=0.01, stale_after_s=60):
        deadline = time.time() + 5
        while len(calls) < 4 and time.time() < deadline:
            time.sleep(0.01)
    assert len(calls) >= 4  # beating still after the first failure


def test_a_holder_whose_lock_was_taken_over_does_not_mark_its_stage_done(tmp_path):
    store = StageStore(tmp_path, poll_s=0.01)

    def build(directory):
        lock = next(tmp_path.glob("*.lock"))
        lock.write_text(json.dumps({"host": "another-node", "pid": 1, "token": "the new holder"}))  # taken over mid-build

    with pytest.raises(LockLost, match="taken over"):
        store.run("squad", {"a": 1}, {}, build)
    assert not list(tmp_path.glob(f"*/{DONE_FILE}"))


def test_a_lock_left_empty_by_a_kill_goes_stale(tmp_path):
    path = tmp_path / "x.lock"
    path.write_text("")  # created, never written: the holder was killed in between
    lock = _FileLock(path, poll_s=0.01, stale_after_s=600)
    assert not lock._stale()  # just created: perhaps being written
    os.utime(path, (time.time() - stages.EMPTY_AFTER_S - 5,) * 2)
    assert lock._stale() and lock._break_if_stale() and not path.exists()


def test_a_paused_holder_on_this_host_keeps_its_lock_and_a_reused_pid_does_not(tmp_path):
    """A SIGSTOPped (or SLURM-suspended) holder is alive: its untouched lock is not taken over,
    where before it went stale after 5 minutes and two processes built into one stage."""
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        os.kill(sleeper.pid, signal.SIGSTOP)
        path = tmp_path / "x.lock"
        owner = {"host": socket.gethostname(), "pid": sleeper.pid, "start": process_start(sleeper.pid), "token": "paused"}
        path.write_text(json.dumps(owner))
        os.utime(path, (time.time() - 3600,) * 2)  # untouched for an hour
        lock = _FileLock(path, poll_s=0.01, stale_after_s=300)
        assert not lock._stale()
        path.write_text(json.dumps({**owner, "start": "1"}))  # the pid now runs another process than the lock's writer
        os.utime(path, (time.time() - 3600,) * 2)
        assert lock._stale()
    finally:
        sleeper.kill()
        sleeper.wait()


def test_two_processes_never_both_build_one_stage(tmp_path):
    """Two stores on one directory, at once: one builds, the other waits and finds it done."""
    built = []
    barrier = threading.Barrier(2)

    found = []

    def job():
        barrier.wait()
        found.append(StageStore(tmp_path, poll_s=0.01).run("squad", {"a": 2}, {}, lambda d: (built.append(d), time.sleep(0.3))))

    threads = [threading.Thread(target=job) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(built) == 1
    builder, waiter = sorted(found, key=lambda stage: not stage.built)
    assert builder.waited == 0.0 and 0.1 < waiter.waited <= waiter.seconds  # the wait is recorded (experiment.json's waited_s)


def test_a_lock_that_came_back_to_life_under_the_break_file_is_kept(tmp_path, monkeypatch):
    """Two waiters saw a stale lock; the second finds, under the break file, that the first already
    replaced it by a live one: it must not remove the new holder's lock."""
    path = tmp_path / "x.lock"
    path.write_text(json.dumps({"host": "elsewhere", "pid": 1, "token": "new-holder"}))
    lock = _FileLock(path, 0.01, 300.0)
    answers = iter([True, False])  # stale at the first look, live at the second
    monkeypatch.setattr(lock, "_stale", lambda: next(answers))
    assert lock._break_if_stale() is False and path.is_file()
