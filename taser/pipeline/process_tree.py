"""A child command whose whole process tree ends with it.

torchrun's agent starts its worker ranks in process sessions of their own: when the job that ran
torchrun is cancelled (SIGTERM from SLURM, an exception), killing the agent alone leaves the ranks
training into a stage directory whose lock has been released. `run_tree` runs the command and, if
it is interrupted, asks every process of the tree to stop (SIGTERM: torchrun's agent then stops
its ranks itself), waits, and kills what is left. The tree is read from /proc before any signal,
so ranks re-parented away from the agent are still found.

A SIGKILL of the job's process (`kill -9`, the OOM killer, a local launcher stopping its worker)
runs no Python, so on Linux the command runs under a guard (`taser.pipeline.tree_guard`): a small
process that adopts every orphan of the tree (a child subreaper) and holds the read end of a pipe
whose write end only the job holds. When the job dies, however it dies, the pipe closes and the
guard stops the whole tree the same way.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from pathlib import Path

log = logging.getLogger(__name__)

GRACE_S = 30.0  # time the tree gets to stop on SIGTERM before SIGKILL


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (Linux /proc), children before their children."""
    found, todo = [], [pid]
    while todo:
        parent = todo.pop(0)
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                children = [int(c) for c in (task / "children").read_text().split()]
            except (OSError, ValueError):
                continue
            found += children
            todo += children
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie has exited: only its parent has not collected it yet
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def stop_pids(tree: list[int], grace_s: float = GRACE_S, poll=lambda: None) -> None:
    """SIGTERM to every process of `tree`, then SIGKILL to whatever still runs after `grace_s`
    (`poll` is called while waiting: it collects children that exited)."""
    for pid in tree:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_alive(pid) for pid in tree):
        poll()
        time.sleep(0.05)
    for pid in tree:
        if _alive(pid):
            log.warning("process %d did not stop on SIGTERM within %.0f s: killed", pid, grace_s)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def stop_tree(process: subprocess.Popen, grace_s: float = GRACE_S) -> None:
    """SIGTERM to `process` and all its descendants, then SIGKILL to whatever still runs after `grace_s`."""
    stop_pids([process.pid, *descendants(process.pid)], grace_s, process.poll)  # poll collects the agent once it exits
    process.wait()


def run_torchrun(module: str, spec: dict, spec_file: Path, processes: int, what: str, resumes_from: Path) -> None:
    """`python -m module spec_file` as `processes` torchrun ranks on this machine (`spec` written to
    `spec_file` for them to read), its whole tree stopped if this call is interrupted; a failure is
    raised naming `what` and where a rerun continues from."""
    import json
    import sys

    spec_file.parent.mkdir(parents=True, exist_ok=True)
    spec_file.write_text(json.dumps(spec, default=str))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}", "-m", module, str(spec_file)]
    log.info("%s on %d processes: %s", what, processes, " ".join(command))
    returncode = run_tree(command)  # interrupted (SIGTERM, an exception), it stops torchrun's ranks too: none outlives the stage's lock
    if returncode != 0:
        raise RuntimeError(f"{what} under torchrun failed (exit {returncode}); its ranks' logs are above; rerun the same command to continue "
                           f"from {resumes_from}")
    spec_file.unlink()


def run_tree(command: list[str], grace_s: float = GRACE_S, **popen) -> int:
    """Run `command`; its exit code (negative: killed by that signal). Interrupted (an exception,
    SystemExit from a SIGTERM handler), it stops the command's whole process tree before the exception
    goes on; killed outright, its guard does (Linux)."""
    import sys

    if not sys.platform.startswith("linux"):
        process = subprocess.Popen(command, **popen)
        alive_fd = None
    else:
        guard_fd, alive_fd = os.pipe()  # the job holds the write end alone (not inherited): closed when it dies
        try:
            process = subprocess.Popen([sys.executable, "-m", "taser.pipeline.tree_guard", str(guard_fd), str(grace_s), "--", *command],
                                       pass_fds=(guard_fd,), **popen)
        finally:
            os.close(guard_fd)
    try:
        return process.wait()
    except BaseException:
        stop_tree(process, grace_s)
        raise
    finally:
        if alive_fd is not None:
            os.close(alive_fd)
