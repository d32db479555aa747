"""The guard of a command run by `taser.pipeline.process_tree.run_tree` (Linux; not for users):

    python -m taser.pipeline.tree_guard FD GRACE_S -- COMMAND...

It runs COMMAND as its child and adopts every orphan below it (PR_SET_CHILD_SUBREAPER: torchrun's
ranks, in sessions of their own, stay its descendants when the agent dies). It stops the whole tree
(SIGTERM, then SIGKILL after GRACE_S) when it is asked to stop (SIGTERM) or when the job that
started it dies, however (the pipe FD, whose write end only the job holds, reads end-of-file). It
exits as COMMAND did: the same code, or the same signal.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading

PR_SET_CHILD_SUBREAPER = 36


def _adopt_orphans() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        print(f"tree_guard: PR_SET_CHILD_SUBREAPER failed (errno {ctypes.get_errno()}): orphans are not adopted", file=sys.stderr)


def _stop_everything(grace_s: float) -> None:
    from taser.pipeline.process_tree import descendants, stop_pids

    def collect() -> None:  # reap the tree's exits (children and adopted orphans), so they count as gone
        try:
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        except ChildProcessError:
            pass

    stop_pids(descendants(os.getpid()), grace_s, collect)


def _watch_job(fd: int, grace_s: float) -> None:
    while True:
        try:
            if not os.read(fd, 1):  # end-of-file: the job that started this guard is gone
                break
        except InterruptedError:
            continue
    _stop_everything(grace_s)
    os._exit(128 + signal.SIGKILL)


def main(argv: list[str]) -> int:
    fd, grace_s, command = int(argv[0]), float(argv[1]), argv[3:]
    _adopt_orphans()
    def on_term(signum, frame):
        _stop_everything(grace_s)
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    child = subprocess.Popen(command)
    threading.Thread(target=_watch_job, args=(fd, grace_s), daemon=True, name="tree-guard-job").start()
    returncode = child.wait()
    _stop_everything(grace_s)  # what the command left behind (orphans it started) ends with it
    if returncode < 0:  # killed by a signal: end the same way, so the job sees what happened
        if -returncode not in (signal.SIGKILL, signal.SIGSTOP):  # those two cannot be handled
            signal.signal(-returncode, signal.SIG_DFL)
        os.kill(os.getpid(), -returncode)
    return returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
