"""The check on every GPU: `torchrun --nproc_per_node=N` started as a subprocess (its own process
group, stopped at `ddp_timeout_s`), each rank running `taser.gpu_check.rank` with the
job (`mode=ddp`) and the data and model directories the main process prepared, written to a
JSON spec. Rank 0 leaves the merged figures in `figures.json`; a failed rank its traceback.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from dataclasses import asdict, replace
from pathlib import Path

from taser.gpu_check.job import GpuCheckJob, Mode, Size

log = logging.getLogger(__name__)

RANK_MODULE = "taser.gpu_check.rank"  # what each rank runs
FIGURES = "figures.json"


def visible_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def ddp_processes(job: GpuCheckJob, device) -> int:
    """How many torchrun processes the all-GPU pass takes (0: none). Default: every visible GPU
    when the check runs on a GPU and there is more than one."""
    if job.ddp_processes is not None:
        if job.ddp_processes and device.type == "cuda" and job.ddp_processes > visible_gpus():
            raise ValueError(f"ddp_processes={job.ddp_processes} but {visible_gpus()} GPU(s) are visible")
        return job.ddp_processes
    gpus = visible_gpus() if device.type == "cuda" else 0
    return gpus if gpus > 1 else 0


def _stop(proc: subprocess.Popen) -> None:
    """End torchrun and its workers (its own process group, started here)."""
    for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def launch(job: GpuCheckJob, processes: int, train_file: str, sources: dict[Size, str], work: Path) -> dict:
    """Run the ranks; their merged figures: {"world_size", "runs": [...], "error": message or absent}."""
    ddp_dir = work / "ddp"
    ddp_dir.mkdir(parents=True, exist_ok=True)
    spec = {"job": asdict(replace(job, mode=Mode.ddp)), "train_file": train_file, "sources": {s.value: p for s, p in sources.items()},
            "work": str(ddp_dir)}
    spec_file = ddp_dir / "spec.json"
    spec_file.write_text(json.dumps(spec, indent=2), encoding="utf-8")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}", "-m", RANK_MODULE, str(spec_file)]
    log.info("all-GPU pass: %s", " ".join(cmd))
    proc = subprocess.Popen(cmd, start_new_session=True)
    try:
        rc = proc.wait(timeout=job.ddp_timeout_s)
    except subprocess.TimeoutExpired:
        _stop(proc)
        rc = None
    except BaseException:
        _stop(proc)
        raise
    figures_file = ddp_dir / FIGURES
    result = json.loads(figures_file.read_text(encoding="utf-8")) if figures_file.is_file() else {"world_size": processes, "runs": []}
    if rc != 0:
        what = f"did not finish within ddp_timeout_s={job.ddp_timeout_s}" if rc is None else f"exited with status {rc}"
        errors = [p.read_text(encoding="utf-8").strip().splitlines()[-1] for p in sorted(ddp_dir.glob("error-rank*.txt"))]
        result["error"] = f"torchrun with {processes} processes {what}" + (f": {errors[0]}" if errors else "")
    return result
