"""A real single-node SLURM cluster for the cluster tests: Debian's `slurm-wlm` (slurmctld and
slurmd as root) with `munge`, its state, spool and logs in a temporary directory, on this machine's
CPUs (ProctrackType=proctrack/linuxproc, TaskPlugin=task/none: no cgroups needed). `.ci/run`
installs the packages; elsewhere the tests that need it are skipped with the reason.

The node declares four CPUs per core it has (SlurmdParameters=config_overrides): the tests' tiny jobs
spend most of their time starting Python and waiting on the scheduler, not computing, and on a
2-core machine a node of 2 CPUs queued them one or two at a time (the rehearsal took 9 minutes).

    with SlurmCluster(tmp_path) as cluster:
        subprocess.run(["sbatch", ...], env=cluster.env)
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

NEEDED = ("slurmctld", "slurmd", "sbatch", "srun", "squeue", "scancel", "munged")


def missing() -> str | None:
    """Why the cluster cannot start here (None: it can)."""
    absent = [tool for tool in NEEDED if shutil.which(tool) is None and not Path("/usr/sbin", tool).exists()]
    if absent:
        return f"SLURM is not installed here ({', '.join(absent)} missing): apt-get install slurm-wlm munge (.ci/run does)"
    if os.geteuid() != 0:
        return "the single-node SLURM cluster runs slurmd as root, and this is not root"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SlurmCluster:
    def __init__(self, root: Path, cpus: int | None = None, memory_mb: int = 16000):
        self.root = Path(root)
        self.cpus = cpus or 4 * (os.cpu_count() or 2)
        self.memory_mb = memory_mb
        self.host = socket.gethostname()
        self.conf = self.root / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self._pids: list[Path] = []

    def _write_conf(self) -> None:
        for name in ("state", "spool", "log"):
            (self.root / name).mkdir(parents=True, exist_ok=True)
        ctl, node = _free_port(), _free_port()
        self.conf.write_text(f"""ClusterName=taser-test
SlurmctldHost={self.host}
SlurmctldPort={ctl}
SlurmdPort={node}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation={self.root}/state
SlurmdSpoolDir={self.root}/spool
SlurmctldPidFile={self.root}/slurmctld.pid
SlurmdPidFile={self.root}/slurmd.pid
SlurmctldLogFile={self.root}/log/slurmctld.log
SlurmdLogFile={self.root}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
MpiDefault=none
SlurmdParameters=config_overrides
ReturnToService=2
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
InactiveLimit=0
KillWait=10
MinJobAge=300
NodeName={self.host} CPUs={self.cpus} RealMemory={self.memory_mb} State=UNKNOWN
PartitionName=debug Nodes={self.host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
""")

    def _start_munge(self) -> None:
        # One munged serves every cluster on this machine. pytest workers start their clusters at the same moment, so
        # the check-then-start runs under a lock: unlocked, two workers both saw no munged, both started one, and the
        # second exited 1 (its socket taken), failing its module's setup in CI.
        Path("/run/munge").mkdir(parents=True, exist_ok=True)
        shutil.chown("/run/munge", "munge", "munge")
        with open("/run/munge/taser-tests.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if subprocess.run(["munge", "-n"], capture_output=True).returncode == 0:
                return  # already running
            started = subprocess.run(["runuser", "-u", "munge", "--", "/usr/sbin/munged"], capture_output=True, text=True)
            deadline = time.time() + 20
            while subprocess.run(["munge", "-n"], capture_output=True).returncode != 0:
                if time.time() > deadline:
                    raise RuntimeError(f"munged did not start (exit {started.returncode}): {started.stderr.strip()}")
                time.sleep(0.2)

    def __enter__(self) -> SlurmCluster:
        self._write_conf()
        self._start_munge()
        for daemon in ("slurmctld", "slurmd"):
            subprocess.run([f"/usr/sbin/{daemon}", "-f", str(self.conf)], check=True, env=self.env)
            self._pids.append(self.root / f"{daemon}.pid")
        deadline = time.time() + 60
        while True:
            done = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, env=self.env)
            if done.returncode == 0 and done.stdout.strip() in ("idle", "mixed", "allocated"):
                return self
            if time.time() > deadline:
                self.__exit__()
                raise RuntimeError(f"the SLURM node did not come up: {done.stdout} {done.stderr}\n{self.logs()}")
            time.sleep(0.5)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in (self.root / "log").glob("*.log"))

    def __exit__(self, *exc) -> None:
        subprocess.run(["scancel", "--full", "-u", "root"], capture_output=True, env=self.env)
        for pid_file in reversed(self._pids):
            try:
                os.kill(int(pid_file.read_text()), signal.SIGTERM)
            except (OSError, ValueError):
                pass
        time.sleep(0.5)

    def run(self, *args: str, check: bool = True, timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(list(args), capture_output=True, text=True, env={**self.env, **kwargs.pop("env", {})}, check=check,
                              timeout=timeout, **kwargs)

    def wait_idle(self, timeout: float = 600) -> None:
        """Until no job is queued or running."""
        deadline = time.time() + timeout
        while self.run("squeue", "-h").stdout.strip():
            if time.time() > deadline:
                raise TimeoutError(f"jobs still in the queue after {timeout} s:\n{self.run('squeue').stdout}")
            time.sleep(1)
