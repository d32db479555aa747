"""The stage lock's liveness (issue 44, item 7 and item 10's pause): a heartbeat that survives an
NFS hiccup, a holder that checks its token before marking a stage done, a lock left empty by a kill
that goes stale, and a paused holder on this host that keeps its lock however long it sleeps."""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

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


def test_a_lock_left_empty_by_a_kill_goes_stale(tmp_path, lock_clock):
    path = tmp_path / "x.lock"
    path.write_text("")  # created, never written: the holder was killed in between
    os.utime(path, (time.time() - 3600,) * 2)  # an old mtime says nothing: another machine's clock (an NFS server's)
    lock = _FileLock(path, poll_s=0.01, stale_after_s=600)
    assert not lock._stale()  # first seen now: perhaps being written
    lock_clock.advance(stages.EMPTY_AFTER_S - 1)
    assert not lock._stale()
    lock_clock.advance(2)  # seen unchanged for EMPTY_AFTER_S of the waiter's own clock
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


def _dead_process() -> tuple[int, str | None]:
    """The pid and start time of a process of this host that has exited."""
    child = subprocess.Popen(["sleep", "60"])
    start = process_start(child.pid)
    child.kill()
    child.wait()
    return child.pid, start


def test_a_lock_of_a_dead_process_on_this_host_is_taken_over_at_once(tmp_path):
    """Would catch a same-host holder's death not seen (the lock then waits out the other-host
    staleness, 5 minutes, or for ever): a lock just written by a process that has since exited is
    stale now, and a waiting build takes it over within seconds, not at STALE_AFTER_S."""
    pid, start = _dead_process()
    path = tmp_path / "x.lock"
    path.write_text(json.dumps({"host": socket.gethostname(), "pid": pid, "start": start, "since": time.time(), "token": "dead"}))
    assert _FileLock(path, poll_s=0.01, stale_after_s=300)._stale()  # touched just now: only its process's death says so

    key = stages.stage_key("squad", {"dead": 1}, {})
    (tmp_path / (key + stages.LOCK_SUFFIX)).write_text(path.read_text())
    began = time.perf_counter()
    result = []
    worker = threading.Thread(target=lambda: result.append(StageStore(tmp_path, poll_s=0.01).run("squad", {"dead": 1}, {}, lambda d: None)),
                              daemon=True)
    worker.start()
    worker.join(timeout=5)
    assert not worker.is_alive(), "still waiting for the lock of a dead process after 5 s"
    assert result and result[0].built and time.perf_counter() - began < 5
    assert not (tmp_path / (key + stages.LOCK_SUFFIX)).exists()


def test_the_heartbeat_touches_the_lock_itself(tmp_path, monkeypatch):
    """Would catch a heartbeat that never touches the lock file (the directory, another name, or not
    at all): a build longer than the staleness timeout is then taken over and built twice. The
    lock's mtime, set an hour back, comes forward while its holder lives, and its content is kept."""
    monkeypatch.setattr(stages, "HEARTBEAT_S", 0.02)
    path = tmp_path / "x.lock"
    with _FileLock(path, poll_s=0.01, stale_after_s=60) as lock:
        owner = path.read_text()
        an_hour_ago = time.time() - 3600
        os.utime(path, (an_hour_ago, an_hour_ago))
        deadline = time.time() + 5
        while path.stat().st_mtime < an_hour_ago + 3000 and time.time() < deadline:
            time.sleep(0.01)
        assert time.time() - path.stat().st_mtime < 60, "the heartbeat did not touch the lock"
        first_beat = path.stat().st_mtime_ns
        deadline = time.time() + 5
        while path.stat().st_mtime_ns == first_beat and time.time() < deadline:
            time.sleep(0.01)
        assert path.stat().st_mtime_ns > first_beat  # and it goes on beating
        assert path.read_text() == owner and lock._owner()["token"] == lock.token
    assert not path.exists()


def _taken_over(tmp_path):
    lock = next(tmp_path.glob("*.lock"))
    lock.write_text(json.dumps({"host": "another-node", "pid": 1, "token": "the new holder"}))  # a waiter elsewhere took it over


def test_a_holder_that_lost_its_lock_stops_waiting_on_its_torchrun_at_once(tmp_path, monkeypatch):
    """A holder paused past the stale limit on another host, resumed, went on building for days beside
    the new holder and learned it only at the end. Now its next heartbeat stops the build: here the main
    thread, blocked waiting on a child process tree (torchrun), whose tree is stopped too."""
    from taser.pipeline.process_tree import run_tree

    monkeypatch.setattr(stages, "HEARTBEAT_S", 0.05)
    store, marker = StageStore(tmp_path, poll_s=0.01), tmp_path / "child.pid"
    # the child (torchrun, say) runs, then a waiter elsewhere takes the lock over
    child = ("import json, os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid()))\n"
             "open(sys.argv[2], 'w').write(json.dumps({'host': 'another-node', 'pid': 1, 'token': 'the new holder'})); time.sleep(60)")

    def build(directory):
        run_tree([sys.executable, "-c", child, str(marker), str(next(tmp_path.glob("*.lock")))], grace_s=5)

    began = time.perf_counter()
    with pytest.raises(LockLost, match="taken over"):
        store.run("squad", {"fenced": 1}, {}, build)
    assert time.perf_counter() - began < 20 and not list(tmp_path.glob(f"*/{DONE_FILE}"))
    assert signal.getsignal(stages.FENCE_SIGNAL) == signal.SIG_DFL  # the handler is the lock's only while it is held
    pid = int(marker.read_text())
    deadline = time.time() + 10
    while Path(f"/proc/{pid}").exists() and Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
        assert time.time() < deadline, "the fenced build's child still runs"
        time.sleep(0.05)


def test_a_holder_building_in_another_thread_is_stopped_too(tmp_path, monkeypatch):
    monkeypatch.setattr(stages, "HEARTBEAT_S", 0.05)
    store, steps, raised = StageStore(tmp_path, poll_s=0.01), [], []

    def build(directory):
        _taken_over(tmp_path)
        for i in range(1000):  # 10 s of work, step by step
            steps.append(i)
            time.sleep(0.01)

    def job():
        try:
            store.run("squad", {"fenced": 2}, {}, build)
        except LockLost as error:
            raised.append(error)

    worker = threading.Thread(target=job)
    worker.start()
    worker.join(timeout=30)
    assert raised and len(steps) < 500 and not list(tmp_path.glob(f"*/{DONE_FILE}"))


def test_a_lock_of_the_same_host_name_in_another_pid_namespace_is_judged_by_its_heartbeat(tmp_path, lock_clock):
    """Containers that share a hostname have pid namespaces of their own: a pid there means nothing
    here, so a live holder's lock must not be taken over because that pid is not running here."""
    pid, start = _dead_process()
    path = tmp_path / "x.lock"
    path.write_text(json.dumps({"host": socket.gethostname(), **stages._process_space(), "pidns": "pid:[1]", "pid": pid, "start": start,
                                "token": "a container's"}))
    lock = _FileLock(path, poll_s=0.01, stale_after_s=300)
    assert not lock._stale()
    lock_clock.advance(299)
    assert not lock._stale()
    lock_clock.advance(2)
    assert lock._stale()
