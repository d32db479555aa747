"""Issue 44, item 8: the row's torchrun ranks (started by the agent in sessions of their own) do not
outlive the job that started them: a SIGTERM to the job stops the whole tree before the stage's
lock is released."""

import os
import signal
import subprocess
import sys
import time

import pytest

from taser.pipeline.process_tree import descendants, run_tree

AGENT = """
import subprocess, sys, time
# a rank in a session of its own, as torchrun's agent starts them; on SIGTERM it notes it and stops, as a rank's handler would
RANK = ("import os, signal, sys, time\\n"
        "signal.signal(signal.SIGTERM, lambda s, f: (open(sys.argv[1] + '.term', 'w').close(), sys.exit(0)))\\n"
        "open(sys.argv[1], 'w').write(str(os.getpid()))\\n"
        "while True: time.sleep(0.05)")
subprocess.Popen([sys.executable, "-c", RANK, sys.argv[1]], start_new_session=True)
time.sleep(600)
"""

JOB = """
import signal, sys
from taser.pipeline.process_tree import run_tree
signal.signal(signal.SIGTERM, lambda s, f: sys.exit(128 + s))  # as scripts/experiment.py does
run_tree([sys.executable, "-c", sys.argv[1], sys.argv[2]], grace_s=5)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = open(f"/proc/{pid}/stat").read()
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _started(pid_file) -> None:
    deadline = time.time() + 60
    while not pid_file.is_file() or not pid_file.read_text():
        assert time.time() < deadline, "the rank never started"
        time.sleep(0.05)


def _ends(pid: int, within_s: float = 10.0) -> bool:
    """Whether `pid` ends within `within_s` (if not, it is killed here, and False)."""
    deadline = time.time() + within_s
    while _alive(pid) and time.time() < deadline:
        time.sleep(0.05)
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)
        return False
    return True


def test_a_terminated_job_stops_the_ranks_in_their_own_sessions(tmp_path):
    rank_pid = tmp_path / "rank.pid"
    job = subprocess.Popen([sys.executable, "-c", JOB, AGENT, str(rank_pid)])
    _started(rank_pid)
    rank = int(rank_pid.read_text())
    assert rank in descendants(job.pid)
    job.send_signal(signal.SIGTERM)
    assert job.wait(timeout=60) == 128 + signal.SIGTERM
    assert _ends(rank), "the rank outlived its job"
    assert (tmp_path / "rank.pid.term").is_file()  # asked to stop (SIGTERM) before any SIGKILL


def test_a_command_that_ends_returns_its_exit_code():
    assert run_tree([sys.executable, "-c", "import sys; sys.exit(3)"]) == 3
    assert run_tree([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"]) == -signal.SIGKILL  # the OOM killer


KILLED_JOB = """
import sys
from taser.pipeline.process_tree import run_tree
run_tree([sys.executable, "-c", sys.argv[1], sys.argv[2]], grace_s=5)
"""


def test_a_job_killed_outright_takes_its_ranks_with_it(tmp_path):
    """`kill -9` of the job's process (the OOM killer, a local launcher) runs no Python: its torchrun
    ranks, in sessions of their own, kept training into a stage whose lock was then free."""
    rank_pid = tmp_path / "rank.pid"
    job = subprocess.Popen([sys.executable, "-c", KILLED_JOB, AGENT, str(rank_pid)])
    _started(rank_pid)
    rank = int(rank_pid.read_text())
    job.send_signal(signal.SIGKILL)
    job.wait(timeout=60)
    assert _ends(rank), "the rank outlived its job"
    assert (tmp_path / "rank.pid.term").is_file()  # asked to stop (SIGTERM) first


def test_sigterm_exits_through_python_unless_a_launcher_handles_it():
    """submitit bypasses SIGTERM on purpose (a preempted job is requeued on its own signal): the
    experiment's handler must not replace it."""
    code = ("import signal, sys\n"
            "from taser.cli import exit_on_sigterm\n"
            "if sys.argv[1] == 'submitit':\n"
            "    bypass = lambda s, f: None\n"
            "    signal.signal(signal.SIGTERM, bypass)\n"
            "installed = exit_on_sigterm()\n"
            "print(installed, sys.argv[1] != 'submitit' or signal.getsignal(signal.SIGTERM) is bypass)\n")
    alone = subprocess.run([sys.executable, "-c", code, "alone"], capture_output=True, text=True, check=True).stdout.split()
    under = subprocess.run([sys.executable, "-c", code, "submitit"], capture_output=True, text=True, check=True).stdout.split()
    assert alone == ["True", "True"] and under == ["False", "True"]


def test_a_failed_torchrun_raises_naming_what_failed_and_where_a_rerun_continues(tmp_path):
    from taser.pipeline.process_tree import run_torchrun

    with pytest.raises(RuntimeError, match=r"encoding under torchrun failed \(exit 1\).*continue from the shards in"):
        run_torchrun("taser.no_such_module", {"x": 1}, tmp_path / "spec.json", 1, "encoding", "the shards in x")
    assert (tmp_path / "spec.json").is_file()  # kept for the rerun's ranks to read again


ORPHANING_AGENT = """
import subprocess, sys
RANK = ("import os, sys, time\\n"
        "open(sys.argv[1], 'w').write(str(os.getpid()))\\n"
        "while True: time.sleep(0.05)")
subprocess.Popen([sys.executable, "-c", RANK, sys.argv[1]], start_new_session=True)
while True:
    import os, time
    if os.path.exists(sys.argv[1]) and open(sys.argv[1]).read():
        break
    time.sleep(0.02)
"""


def test_a_rank_its_agent_left_behind_ends_with_the_command(tmp_path):
    """An agent that exits (or crashes) leaves its ranks re-parented, out of its tree: the guard adopts
    them and stops them when the command ends, so none outlives the stage."""
    rank_pid = tmp_path / "rank.pid"
    assert run_tree([sys.executable, "-c", ORPHANING_AGENT, str(rank_pid)], grace_s=5) == 0
    rank = int(rank_pid.read_text())
    assert _ends(rank), "the orphaned rank outlived its command"
