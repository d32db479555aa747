"""The stage store's contract, piece by piece (issue 46, mutation testing of `taser/pipeline/stages.py`):
the key's exact form (keys are addresses: a change rebuilds every stage of every store), what
`stage.json` and a `Stage` hold, a build resumed in its own directory, a waiter that finds the stage
built by another process, the lock file's contents, and what a lock's holder and its waiters log."""

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
from conftest import LockClock

import taser.pipeline.stages as stages
from taser.pipeline.stages import DONE_FILE, LockLost, PlannedStore, PrepareStore, StageStore, _FileLock, process_start, stage_key


@pytest.fixture
def version_3(monkeypatch):
    monkeypatch.setattr(stages.stage_code, "version", lambda kind: 3)


def test_a_stage_key_is_pinned_to_its_serialisation(version_3):
    """Would catch any change to how a key is computed (the JSON's names, its key order, how a path
    is written, the digest's length): every stage already built would be rebuilt under a new name.
    Such a change must be deliberate: this figure is updated with it, in the same commit."""
    key = stage_key("train", {"lr": 2e-5, "model": {"pretrained": Path("/models/bert")}}, {"train": "squad-0123456789abcdef"})
    assert key == "train-440b7cfd2c1357bb"
    reordered = stage_key("train", {"model": {"pretrained": "/models/bert"}, "lr": 2e-5}, {"train": "squad-0123456789abcdef"})
    assert reordered == key  # the settings' order, and a path or its text, do not matter


def _built(store, kind="squad", settings=None, inputs=None, seconds=0.05):
    def build(directory):
        time.sleep(seconds)
        (directory / "out.txt").write_text("built")

    return store.run(kind, settings or {"a": Path("/x")}, inputs or {"f": "file-1"}, build)


def test_stage_json_holds_what_built_the_stage_written_for_people(tmp_path, version_3):
    """Would catch a field of `stage.json` renamed or dropped, its time wrong or its format unreadable."""
    stage = _built(StageStore(tmp_path / "store"))
    text = (stage.dir / DONE_FILE).read_text()
    record = json.loads(text)
    assert text == json.dumps(record, indent=2)  # indented: people read it
    assert sorted(record) == ["commit", "finished", "inputs", "key", "kind", "seconds", "settings", "version"]
    assert (record["key"], record["kind"], record["version"], record["settings"], record["inputs"]) == (
        stage.key, "squad", 3, {"a": "/x"}, {"f": "file-1"})
    assert record["commit"] == stages.code_commit() and 0.05 <= record["seconds"] < 30 and record["seconds"] == stage.seconds
    finished = time.mktime(time.strptime(record["finished"], "%Y-%m-%dT%H:%M:%S%z"))
    assert abs(finished - time.time()) < 60


def test_a_stage_built_then_found_says_which(tmp_path, caplog):
    """Would catch a wrong `Stage` (built, seconds, waited) or log line, from the build or the find."""
    store = StageStore(tmp_path / "store")
    with caplog.at_level(logging.INFO, logger="taser.pipeline.stages"):
        built = _built(store)
        found = _built(store)
    assert (built.built, built.waited) == (True, 0.0) and 0.05 <= built.seconds < 30
    assert (found.key, found.dir, found.built, found.seconds, found.waited) == (built.key, built.dir, False, 0.0, 0.0)
    assert [r.getMessage() for r in caplog.records] == [f"stage {built.key}: building in {built.dir}",
                                                        f"stage {built.key}: done already ({built.dir})"]


def test_a_killed_build_resumes_in_its_own_directory_under_a_store_not_made_yet(tmp_path):
    """Would catch the stage's directory (or the store's root, several levels deep) not made, or a
    rerun refused because the killed build's directory is there."""
    store = StageStore(tmp_path / "a" / "b" / "store")
    seen = []

    def killed(directory):
        (directory / "checkpoint").write_text("step 3")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        store.run("squad", {"a": 1}, {}, killed)
    stage = store.run("squad", {"a": 1}, {}, lambda directory: seen.append((directory / "checkpoint").read_text()))
    assert seen == ["step 3"] and stage.built and (stage.dir / DONE_FILE).is_file()


def _live_lock(path: Path, host: str | None = None, pid: int | None = None, token: str = "the other holder") -> None:
    pid = os.getpid() if pid is None else pid
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"host": host or socket.gethostname(), "pid": pid, "start": process_start(pid), "since": time.time(),
                                "token": token}))


def test_a_waiter_finds_the_stage_another_process_built_and_says_how_long_it_waited(tmp_path, caplog):
    """Would catch the stage found after the wait returned as built here, with a wrong key, directory
    or time, or built a second time; and a wrong "waiting for" line."""
    store = StageStore(tmp_path, poll_s=0.02)
    key = stage_key("squad", {"a": 1}, {})
    lock = tmp_path / (key + ".lock")
    _live_lock(lock)  # a live process on this host holds it (this one: alive, so never stale)

    def other_process_finishes():
        time.sleep(0.3)
        (tmp_path / key).mkdir()
        (tmp_path / key / DONE_FILE).write_text("{}")
        lock.unlink()

    threading.Thread(target=other_process_finishes).start()
    with caplog.at_level(logging.INFO, logger="taser.pipeline.stages"):
        stage = store.run("squad", {"a": 1}, {}, lambda directory: pytest.fail("built twice"))
    assert (stage.key, stage.dir, stage.built) == (key, tmp_path / key, False)
    assert 0.25 <= stage.waited <= stage.seconds < 10
    assert [r.getMessage() for r in caplog.records] == [f"waiting for {lock} (another process is building this stage)"]


def test_a_waiter_builds_a_stage_its_holder_left_unbuilt_and_says_how_long_it_waited(tmp_path):
    """Would catch the wait before a build left out of the `Stage` (the sweep schedules its jobs so none waits)."""
    store = StageStore(tmp_path, poll_s=0.02)
    key = stage_key("squad", {"a": 1}, {})
    lock = tmp_path / (key + ".lock")
    _live_lock(lock)
    threading.Thread(target=lambda: (time.sleep(0.3), lock.unlink())).start()  # its build failed: no stage.json
    stage = store.run("squad", {"a": 1}, {}, lambda directory: None)
    assert stage.built and 0.25 <= stage.waited <= stage.seconds < 10


def test_the_lock_file_names_its_holder(tmp_path):
    """Would catch a field of the lock file renamed or wrong: waiters on this host tell a dead or
    reused pid by it, waiters elsewhere its age, and people read who holds it."""
    path = tmp_path / "x.lock"
    before = time.time()
    with _FileLock(path, poll_s=0.01, stale_after_s=60) as lock:
        held = json.loads(path.read_text())
    assert held == {"host": socket.gethostname(), **stages._process_space(), "pid": os.getpid(), "start": process_start(os.getpid()),
                    "since": held["since"], "token": lock.token}
    assert set(stages._process_space()) == {"boot", "pidns"}  # Linux: a pid means one process within one boot and pid namespace
    assert before <= held["since"] <= time.time() and lock.token.startswith(f"{socket.gethostname()}:{os.getpid()}:")
    assert lock.token != _FileLock(path, poll_s=0.01, stale_after_s=60).token and not path.exists()


def test_the_heartbeat_stops_with_the_lock(tmp_path, monkeypatch):
    """Would catch a heartbeat left running after the lock is released: it would keep touching the
    next holder's lock at that path (a dead next holder's lock would then never go stale)."""
    monkeypatch.setattr(stages, "HEARTBEAT_S", 0.02)
    path = tmp_path / "x.lock"
    with _FileLock(path, poll_s=0.01, stale_after_s=60):
        pass
    path.write_text("{}")  # the next holder's lock, a minute old
    os.utime(path, (time.time() - 60,) * 2)
    time.sleep(0.2)
    assert time.time() - path.stat().st_mtime > 50


def test_a_failing_heartbeat_warns_once_per_run_of_failures(tmp_path, monkeypatch, caplog):
    """Would catch a warning at every failed touch (a log flooded every 30 s), or none at the first."""
    monkeypatch.setattr(stages, "HEARTBEAT_S", 0.01)
    real_utime, outcomes = os.utime, iter([False, True, False, False])  # fail, touch, fail twice, then touch

    def touch(path, *args, **kwargs):
        if not next(outcomes, True):
            raise OSError("Stale file handle")
        return real_utime(path, *args, **kwargs)

    monkeypatch.setattr(stages.os, "utime", touch)
    path = tmp_path / "x.lock"
    with caplog.at_level(logging.WARNING, logger="taser.pipeline.stages"), _FileLock(path, poll_s=0.01, stale_after_s=60):
        time.sleep(0.4)
    assert [r.getMessage() for r in caplog.records] == [
        f"could not touch the lock {path} (Stale file handle); retrying every {stages.HEARTBEAT_S:.0f} s"] * 2


def test_a_lost_lock_names_who_holds_it_now(tmp_path):
    """Would catch a wrong LockLost message: the new holder's token, or "nobody" where the lock is gone."""
    path = tmp_path / "x.lock"
    with _FileLock(path, poll_s=0.01, stale_after_s=60) as lock:
        path.write_text(json.dumps({"token": "node7:42:1"}))
        with pytest.raises(LockLost) as taken:
            lock.check_held()
        path.unlink()
        with pytest.raises(LockLost) as gone:
            lock.check_held()
    assert str(taken.value) == (f"the lock {path} was taken over while this process built its stage (now held by node7:42:1); "
                                "the stage is not marked done: rerun to build or find it")
    assert "(now held by nobody)" in str(gone.value)


def test_a_lock_from_another_host_goes_stale_after_the_stores_time(tmp_path, lock_clock):
    """Would catch the store's `stale_after_s` not reaching its locks: a lock from a lost node, a
    little older than that, is taken over (here in 1 s, not the default 5 minutes)."""
    store = StageStore(tmp_path, poll_s=0.02, stale_after_s=1.0)
    key = stage_key("squad", {"a": 1}, {})
    _live_lock(tmp_path / (key + ".lock"), host="a-lost-node", pid=1)
    done = []
    worker = threading.Thread(target=lambda: done.append(store.run("squad", {"a": 1}, {}, lambda d: None)), daemon=True)  # a hang fails the test, not the run
    worker.start()
    time.sleep(0.3)
    assert not done  # waiting: unchanged for 0 s of its clock
    lock_clock.advance(1.5)
    worker.join(timeout=20)
    assert done and done[0].built
    fresh = tmp_path / "fresh.lock"
    _live_lock(fresh, host="a-lost-node", pid=1)
    default, short = _FileLock(fresh, poll_s=0.01, stale_after_s=None), _FileLock(fresh, poll_s=0.01, stale_after_s=1.0)
    assert not default._stale() and not short._stale()  # first seen
    lock_clock.advance(2)
    assert not default._stale()  # the default: 300 s
    assert short._stale()


def test_a_missing_lock_is_not_stale_and_checking_a_live_holder_leaves_it_alone(tmp_path):
    """Would catch a lock removed in the meantime taken as stale, and a liveness check that signals
    the holder (signal 0 tests the pid; any other would hang up or kill it)."""
    assert not _FileLock(tmp_path / "none.lock", poll_s=0.01, stale_after_s=1.0)._stale()
    holder = subprocess.Popen(["sleep", "30"], preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))  # not nohup's SIG_IGN
    try:
        time.sleep(0.1)
        _live_lock(tmp_path / "x.lock", pid=holder.pid)
        assert not _FileLock(tmp_path / "x.lock", poll_s=0.01, stale_after_s=1.0)._stale()
        time.sleep(0.1)
        assert holder.poll() is None  # still running
    finally:
        holder.kill()
        holder.wait()


def test_the_start_time_of_a_process_whose_name_has_a_parenthesis(tmp_path):
    """Would catch /proc/<pid>/stat split at the first ")" instead of the last: a command named "x) 1 2"
    shifts the fields, and a reused pid would no longer be told from the holder."""
    odd = tmp_path / "x) 1 2"
    shutil.copy(shutil.which("sleep"), odd)
    plain = subprocess.Popen(["sleep", "30"])
    named = subprocess.Popen([str(odd), "30"])
    try:
        time.sleep(0.1)
        assert f"{named.pid} (x) 1 2) " in Path(f"/proc/{named.pid}/stat").read_text()
        ticks = os.sysconf("SC_CLK_TCK")
        assert abs(int(process_start(named.pid)) - int(process_start(plain.pid))) < 5 * ticks  # started together
    finally:
        for process in (plain, named):
            process.kill()
            process.wait()


def test_taking_over_a_stale_lock_names_its_holder_and_a_break_under_way_is_left_alone(tmp_path, caplog, jumping_lock_clock):
    """Would catch a wrong takeover warning (the holder's token, else what the file held, else
    "nobody: left empty"), and a second waiter breaking a lock while another one is at it."""
    for held, named in (({"host": "a-lost-node", "pid": 1, "token": "node7:42:1"}, "node7:42:1"),
                        ({"host": "a-lost-node", "pid": 1}, str({"host": "a-lost-node", "pid": 1})),
                        (None, "nobody: left empty")):
        path = tmp_path / "x.lock"
        path.write_text(json.dumps(held) if held else "")
        waiter = _FileLock(path, poll_s=0.01, stale_after_s=1.0)
        assert not waiter._stale()  # a first look
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="taser.pipeline.stages"):
            assert waiter._break_if_stale() and not path.exists()
        assert [r.getMessage() for r in caplog.records] == [f"taking over the stale lock {path} (held by {named})"]
        assert not (tmp_path / "x.lock.break").exists()
    path.write_text("")
    (tmp_path / "x.lock.break").write_text("")  # another waiter is breaking it
    waiter = _FileLock(path, poll_s=0.01, stale_after_s=1.0)
    assert not waiter._stale()
    assert not waiter._break_if_stale() and path.exists()


def test_a_planned_and_a_prepare_store_name_stages_as_the_real_store_does(tmp_path, version_3):
    """Would catch a planned or a preparing store keying a stage otherwise than the real store, or
    saying it built (or spent time on) one it did not; the preparing store builds CPU stages only."""
    settings, inputs = {"a": 1}, {"f": "file-1"}
    key = stage_key("train", settings, inputs)
    planned = PlannedStore(tmp_path)
    stage = planned.run("train", settings, inputs, lambda d: pytest.fail("a planned store builds nothing"))
    assert (stage.key, stage.dir, stage.built, stage.seconds) == (key, tmp_path / key, False, 0.0) and planned.kinds == {key: "train"}
    assert PlannedStore().root == Path("stages")
    prepare = PrepareStore(tmp_path / "prep")
    later = prepare.run("train", settings, inputs, lambda d: pytest.fail("a GPU stage is not built by the CPU job"))
    assert (later.key, later.dir, later.built, later.seconds) == (key, tmp_path / "prep" / key, False, 0.0)
    cpu = prepare.run("bm25-index", settings, inputs, lambda d: (d / "index").write_text("x"))
    assert cpu.built and cpu.key == stage_key("bm25-index", settings, inputs)
    assert (cpu.record["settings"], cpu.record["inputs"]) == (settings, inputs)


def test_code_commit_names_this_checkout(monkeypatch):
    """Would catch the commit read from elsewhere than the library's own checkout."""
    stages.code_commit.cache_clear()
    try:
        here = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=40"], capture_output=True, text=True,
                              cwd=Path(stages.__file__).resolve().parent).stdout.strip()
        assert stages.code_commit() == (here or None)
    finally:
        stages.code_commit.cache_clear()


def test_a_break_file_left_by_a_killed_waiter_does_not_block_the_lock_for_ever(tmp_path, caplog, monkeypatch):
    """Would catch a `.break` file left by a waiter killed mid-takeover kept for good (every later
    waiter would wait for ever), or a fresh one (another waiter at work) removed."""
    store = StageStore(tmp_path, poll_s=0.02, stale_after_s=1.0)
    key = stage_key("squad", {"a": 1}, {})
    lock, breaker = tmp_path / (key + ".lock"), tmp_path / (key + ".lock.break")
    _live_lock(lock, host="a-lost-node", pid=1)
    breaker.write_text("")
    clock = LockClock(jump=1000.0)  # every look 1,000 s after the last
    monkeypatch.setattr(_FileLock, "clock", staticmethod(clock))
    done = []
    with caplog.at_level(logging.WARNING, logger="taser.pipeline.stages"):
        worker = threading.Thread(target=lambda: done.append(store.run("squad", {"a": 1}, {}, lambda d: None)), daemon=True)
        worker.start()
        worker.join(timeout=20)
    assert done and done[0].built and not breaker.exists() and not lock.exists()
    assert caplog.records[0].getMessage().startswith(f"removing {breaker}, left ")
    fresh = tmp_path / "x.lock.break"
    fresh.write_text("")
    monkeypatch.setattr(_FileLock, "clock", staticmethod(LockClock()))
    waiter = _FileLock(tmp_path / "x.lock", poll_s=0.01, stale_after_s=1.0)
    waiter._clear_abandoned(fresh)
    waiter._clear_abandoned(fresh)
    assert fresh.exists()  # another waiter is taking over (seen unchanged for 0 s): left alone
