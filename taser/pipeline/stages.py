"""Stage outputs addressed by what produces them: a store where each stage's directory is named by a
key derived from the settings and inputs that determine it.

`StageStore.run(kind, settings, inputs, build)` returns the directory of that stage, building it
only when it is not done: another row (or seed, or job) that asks for the same stage with the same
settings and inputs finds it. A stage is done when its `stage.json` exists; `build` works in the
stage's own directory and `stage.json` is written last, so a killed build is never taken as done,
and the next run calls `build` again in the same directory (a resumable stage, training or
encoding, continues where it stopped). Two processes that need one stage at once do not both build
it: the first takes the stage's lock (a file created exclusively, which also works on a shared
file system, kept alive by a heartbeat), the others wait for it and then find the stage done; a
lock whose holder died (killed, out of time, a lost node) goes stale and is taken over by one of them.

Keys: `stage_key(kind, settings, inputs)` hashes the settings (JSON, sorted keys; callers pass them
in canonical form, `taser.pipeline.stage_settings`), the inputs (an upstream stage's key, or a
file's identity: its size and the hash of its whole content, `taser.pipeline.file_hashes`) and the
kind's recipe version (`taser.pipeline.stage_code`: bumped when the code that builds that kind
changes what it builds). `stage.json` records all three and the commit the stage was built at.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from taser.io import atomic_open, clear_leftovers
from taser.pipeline import stage_code
from taser.pipeline.file_hashes import file_identity

__all__ = ["DONE_FILE", "Stage", "StageBusy", "StageStore", "code_commit", "file_identity", "stage_key"]

log = logging.getLogger(__name__)

DONE_FILE = "stage.json"
REQUEST_FILE = "stage-request.json"  # a stage's kind, settings and inputs, written when its build starts (found before it is done)
LOCK_SUFFIX = ".lock"


@cache
def code_commit() -> str | None:
    """The git commit of the library's source tree, `-dirty` when it has uncommitted changes (None outside a git checkout)."""
    try:
        out = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=40"], capture_output=True, text=True, timeout=20,
                             cwd=Path(__file__).resolve().parent)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def stage_key(kind: str, settings: dict, inputs: dict) -> str:
    """`<kind>-<16 hex digits>` of the settings, inputs and the kind's recipe version (a changed one gives a new key)."""
    text = json.dumps({"kind": kind, "version": stage_code.version(kind), "settings": settings, "inputs": inputs}, sort_keys=True, default=str)
    return f"{kind}-{hashlib.sha256(text.encode()).hexdigest()[:16]}"


@dataclass
class Stage:
    key: str
    dir: Path
    built: bool  # built by this call (False: found done)
    seconds: float  # this call's time on it (building, or waiting for another process's build)
    waited: float = 0.0  # of which waiting for another process's lock on it (a table's sweep schedules its jobs so none waits)

    @property
    def record(self) -> dict:
        return json.loads((self.dir / DONE_FILE).read_text())


class StageStore:
    planned = False  # True: keys only, nothing built (PlannedStore)

    def __init__(self, root: str | os.PathLike, poll_s: float = 2.0, stale_after_s: float | None = None, wait: bool = True):
        self.root = Path(root)
        self.poll_s = poll_s
        self.stale_after_s = stale_after_s  # a lock untouched this long is taken over (None: STALE_AFTER_S)
        self.wait = wait  # False: a stage another live process builds raises StageBusy at once (a sweep's job: its driver waits instead)

    def dir(self, key: str) -> Path:
        return self.root / key

    def done(self, key: str) -> bool:
        return (self.dir(key) / DONE_FILE).is_file()

    def run(self, kind: str, settings: dict, inputs: dict, build: Callable[[Path], None]) -> Stage:
        """The stage's directory, built by `build(directory)` unless it is done (see the module notes)."""
        key = stage_key(kind, settings, inputs)
        directory = self.dir(key)
        start = time.perf_counter()
        if self.done(key):
            log.info("stage %s: done already (%s)", key, directory)
            return Stage(key, directory, False, 0.0)
        with self._lock(key) as lock:
            if self.done(key):  # another process built it while this one waited
                return Stage(key, directory, False, time.perf_counter() - start, lock.waited)
            directory.mkdir(parents=True, exist_ok=True)
            if not (directory / REQUEST_FILE).is_file():
                with atomic_open(directory / REQUEST_FILE) as f:
                    json.dump({"key": key, "kind": kind, "settings": settings, "inputs": inputs}, f, indent=2, default=str)
            log.info("stage %s: building in %s", key, directory)
            self._clear(directory, "before its build")
            build(directory)
            self._clear(directory, "after its build")
            seconds = time.perf_counter() - start
            lock.check_held()  # a holder whose lock was taken over must not mark the stage done
            with atomic_open(directory / DONE_FILE) as f:
                json.dump({"key": key, "kind": kind, "version": stage_code.version(kind), "settings": settings, "inputs": inputs,
                           "commit": code_commit(), "seconds": seconds,
                           "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z")}, f, indent=2, default=str)
        return Stage(key, directory, True, seconds, lock.waited)

    @staticmethod
    def _clear(directory: Path, when: str) -> None:
        removed = clear_leftovers(directory)
        if removed:
            log.info("removed %d temporary file(s) left by a killed writer in %s (%s): %s", len(removed), directory, when,
                     ", ".join(p.name for p in removed[:5]))

    def _lock(self, key: str):
        return _FileLock(self.root / (key + LOCK_SUFFIX), self.poll_s, self.stale_after_s, wait=self.wait)

    def records_of(self, kind: str) -> list[dict]:
        """The recorded kind, settings and inputs of every stage of `kind` in the store, done or
        started (`done` says which), each with its `key`."""
        found = []
        for directory in sorted(self.root.glob(f"{kind}-*")) if self.root.is_dir() else []:
            for name, done in ((DONE_FILE, True), (REQUEST_FILE, False)):
                try:
                    record = json.loads((directory / name).read_text())
                except (OSError, ValueError):
                    continue
                if record.get("kind") == kind:
                    found.append({**record, "key": directory.name, "done": done})
                    break
        return found


class PlannedStore(StageStore):
    """A store that builds nothing: `run` returns each stage's key and directory as the real store
    would (a table's stage graph, shown without running it: `taser.sweeps.plan`)."""

    planned = True

    def __init__(self, root: str | os.PathLike = "stages"):
        super().__init__(root)
        self.kinds: dict[str, str] = {}

    def run(self, kind: str, settings: dict, inputs: dict, build: Callable[[Path], None]) -> Stage:
        key = stage_key(kind, settings, inputs)
        self.kinds[key] = kind
        return Stage(key, self.dir(key), False, 0.0)


CPU_KINDS = frozenset({"squad", "qa-subset", "passages-subset", "bm25-index", "negatives-bm25"})  # stages that never use a GPU


class PrepareStore(StageStore):
    """A store that builds only the stages of CPU_KINDS (data, BM25's index and mined negatives) and
    names the others without building them: a row's CPU work, done by a CPU job before the jobs that
    hold GPUs start (`JobPhase.prepare`, scheduled by the table's sweep)."""

    def run(self, kind: str, settings: dict, inputs: dict, build: Callable[[Path], None]) -> Stage:
        if kind in CPU_KINDS:
            return super().run(kind, settings, inputs, build)
        key = stage_key(kind, settings, inputs)
        return Stage(key, self.dir(key), False, 0.0)


HEARTBEAT_S = 30.0  # a lock's holder touches it this often
STALE_AFTER_S = 300.0  # a lock untouched this long is stale (its holder died on another host, or was killed)
EMPTY_AFTER_S = 60.0  # a lock file still empty this long was left by a holder killed between creating and writing it


class LockLost(RuntimeError):
    """The stage's lock was taken over while this process built it: the stage is not marked done."""


class StageBusy(RuntimeError):
    """A stage this process would wait for is being built by another live process (raised instead of
    waiting where the store does not wait: a sweep's job, whose driver waits for it instead)."""

    def __init__(self, key: str, lock: Path, holder: str):
        super().__init__(f"stage {key} is being built by another live process ({holder}; lock {lock}): this job does not wait for it "
                         "inside its allocation; the sweep's driver waits and runs it again")
        self.key, self.lock, self.holder = key, str(lock), holder

    def __reduce__(self):  # pickled back to the sweep's driver by submitit
        return StageBusy, (self.key, Path(self.lock), self.holder)


def process_start(pid: int) -> str | None:
    """A process's start time in clock ticks since boot (Linux), telling it from a later process with its pid."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _process_space() -> dict:
    """What makes a pid mean one process on this machine: the boot and the pid namespace (containers
    that share a hostname have pid namespaces of their own)."""
    space = {}
    for name, path in (("boot", "/proc/sys/kernel/random/boot_id"), ("pidns", "/proc/self/ns/pid")):
        try:
            space[name] = Path(path).read_text().strip() if name == "boot" else os.readlink(path)
        except OSError:
            pass
    return space


FENCE_SIGNAL = signal.SIGUSR1  # sent to the building main thread when its lock was taken over (used only where nothing else handles it)


class _Fence:
    """The main thread's held locks and the FENCE_SIGNAL handler, installed while it holds any (and only
    where nothing else handles that signal): the handler raises LockLost for a lock that was taken over."""

    def __init__(self):
        self.held: list = []
        self.previous = None
        self.installed = False

    def arm(self, lock) -> None:
        if not self.held and signal.getsignal(FENCE_SIGNAL) in (signal.SIG_DFL, None):
            self.previous = signal.signal(FENCE_SIGNAL, self._handler)
            self.installed = True
        self.held.append(lock)

    def disarm(self, lock) -> None:
        if lock in self.held:
            self.held.remove(lock)
        if not self.held and self.installed and threading.current_thread() is threading.main_thread():
            signal.signal(FENCE_SIGNAL, self.previous)
            self.installed = False

    def holds(self, lock) -> bool:
        return self.installed and lock in self.held

    def _handler(self, signum, frame) -> None:
        for lock in list(self.held):
            if lock.lost:
                lock.check_held()


_FENCED = _Fence()


class _FileLock:
    """A lock file created exclusively (O_EXCL), holding its owner's host, boot, pid namespace, pid,
    process start time and a token; the holder touches it every HEARTBEAT_S seconds (an error, an NFS
    hiccup, is retried at the next beat).

    A lock is stale when its process is gone (same host, boot and pid namespace: the pid is not
    running, or runs another process than the one that wrote the lock), or otherwise when the waiter
    has seen its modification time unchanged for `stale_after_s` seconds of the waiter's own clock
    (a killed job, a lost node: no clock of another machine, or of an NFS server, is compared with
    this one's); a live process on this host keeps its lock however long it is paused (SIGSTOP, a
    suspended SLURM job). A lock file left empty by a kill between its creation and its first write
    is stale once seen unchanged for EMPTY_AFTER_S.

    Fencing: at every beat the holder checks that the lock still holds its token; a holder whose lock
    was taken over (paused on another host past the stale limit) stops building at once: LockLost is
    raised in the building thread (a signal wakes a main thread blocked on a child process, whose
    tree is then stopped), and it is checked again before the stage is marked done (`check_held`).
    Breaking a stale lock is itself serialised (a `.break` file created exclusively; one seen unchanged
    for EMPTY_AFTER_S was left by a waiter killed while breaking, and is removed), and the lock is
    checked again under it, so two waiters never both take it over; a holder removes the lock only
    while it still holds its own token."""

    clock = staticmethod(time.monotonic)  # the waiter's own clock (tests replace it)

    def __init__(self, path: Path, poll_s: float, stale_after_s: float | None, wait: bool = True):
        self.path, self.poll_s, self.wait = path, poll_s, wait
        self.stale_after_s = STALE_AFTER_S if stale_after_s is None else stale_after_s
        self.token = f"{socket.gethostname()}:{os.getpid()}:{time.time_ns()}"
        self._stop: threading.Event | None = None
        self._seen: dict[Path, tuple[tuple, float]] = {}  # path -> (its stat as last seen, when first seen so)
        self._builder: int | None = None
        self.lost = False
        self.waited = 0.0  # seconds spent waiting for another holder

    def __enter__(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        waited = False
        start = time.perf_counter()
        while True:
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                if self._break_if_stale():
                    continue
                if not self.wait and self.path.exists():
                    owner = self._owner()
                    raise StageBusy(self.path.name.removesuffix(LOCK_SUFFIX), self.path, owner.get("token") or "being written") from None
                if not waited:
                    log.info("waiting for %s (another process is building this stage)", self.path)
                    waited = True
                time.sleep(self.poll_s)
                continue
            self.waited = time.perf_counter() - start if waited else 0.0
            with os.fdopen(fd, "w") as f:
                json.dump({"host": socket.gethostname(), **_process_space(), "pid": os.getpid(), "start": process_start(os.getpid()),
                           "since": time.time(), "token": self.token}, f)
            self._arm_fence()
            self._stop = threading.Event()
            threading.Thread(target=self._beat, args=(self._stop,), daemon=True, name="stage-lock-heartbeat").start()
            return self

    def __exit__(self, *exc):
        if self._stop is not None:
            self._stop.set()
        self._disarm_fence()
        if self._owner().get("token") == self.token:
            self.path.unlink(missing_ok=True)
        return False

    def check_held(self) -> None:
        owner = self._owner()
        if owner.get("token") != self.token:
            raise LockLost(f"the lock {self.path} was taken over while this process built its stage (now held by "
                           f"{owner.get('token') or 'nobody'}); the stage is not marked done: rerun to build or find it")

    def _arm_fence(self) -> None:
        self._builder = threading.get_ident()
        if threading.current_thread() is threading.main_thread():
            _FENCED.arm(self)

    def _disarm_fence(self) -> None:
        _FENCED.disarm(self)
        self._builder = None

    def _fence(self) -> None:
        """Stop the building thread: the lock is another process's now."""
        self.lost = True
        log.error("the lock %s was taken over while this process built its stage (paused past the stale limit?): stopping the build",
                  self.path)
        builder = self._builder
        if builder is None:
            return
        if _FENCED.holds(self):
            signal.pthread_kill(builder, FENCE_SIGNAL)  # wakes a main thread blocked in a system call (waiting on torchrun)
        else:
            import ctypes

            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(builder), ctypes.py_object(LockLost))

    def _beat(self, stop: threading.Event) -> None:
        failing = False
        while not stop.wait(HEARTBEAT_S):
            owner = self._owner()
            if owner and owner.get("token") != self.token or not owner and not self.path.exists():
                if not stop.is_set():
                    self._fence()
                return
            try:
                os.utime(self.path)
                failing = False
            except OSError as error:  # retried at the next beat: one failure must not let the lock go stale
                if not failing:
                    log.warning("could not touch the lock %s (%s); retrying every %.0f s", self.path, error, HEARTBEAT_S)
                failing = True

    def _owner(self) -> dict:
        try:
            return json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}

    def _unchanged_for(self, path: Path) -> float | None:
        """Seconds of this process's clock since `path` was first seen as it is now (0.0 at a change); None when gone."""
        try:
            st = path.stat()
        except OSError:
            return None
        state, now = (st.st_mtime_ns, st.st_size, st.st_ino), self.clock()
        seen = self._seen.get(path)
        if seen is None or seen[0] != state:
            self._seen[path] = (state, now)
            return 0.0
        return now - seen[1]

    def _stale(self) -> bool:
        owner = self._owner()
        age = self._unchanged_for(self.path)
        if age is None:
            return False  # just removed
        if not owner:
            return age > EMPTY_AFTER_S  # being written, or left empty by a kill
        mine = {"host": socket.gethostname(), **_process_space()}
        if all(owner.get(k, v) == v for k, v in mine.items()):  # a pid of this machine's pid namespace
            try:
                os.kill(int(owner["pid"]), 0)
            except ProcessLookupError:
                return True
            except PermissionError:
                pass
            start = owner.get("start")
            return start is not None and process_start(int(owner["pid"])) not in (None, start)  # alive (if paused): its lock
        return age > self.stale_after_s

    def _clear_abandoned(self, breaker: Path) -> None:
        """Remove a break file seen unchanged for EMPTY_AFTER_S: breaking takes milliseconds, so it was
        left by a waiter killed in between, and every later waiter would otherwise wait for ever."""
        age = self._unchanged_for(breaker)
        if age is not None and age > EMPTY_AFTER_S:
            log.warning("removing %s, left unchanged for %.0f s by a waiter killed while it took over a stale lock", breaker, age)
            breaker.unlink(missing_ok=True)

    def _break_if_stale(self) -> bool:
        """Remove a stale lock, one process at a time; True when it was removed."""
        if not self._stale():
            return False
        breaker = self.path.with_name(self.path.name + ".break")
        try:
            fd = os.open(breaker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            self._clear_abandoned(breaker)
            return False  # another process is breaking it
        try:
            os.close(fd)
            owner = self._owner()
            if self._stale():  # still the stale one, under the break file
                log.warning("taking over the stale lock %s (held by %s)", self.path, owner.get("token") or owner or "nobody: left empty")
                self.path.unlink(missing_ok=True)
                return True
            return False
        finally:
            breaker.unlink(missing_ok=True)
