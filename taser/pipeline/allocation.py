"""What a job was given and how long it waited for it: SLURM's view of the job that runs a row
(its id, partition, nodes, CPUs, memory, GPUs) and the queue wait (submit to start, from `squeue`),
recorded in the row's `experiment.json`. Outside SLURM: the machine's CPUs and visible GPUs."""

from __future__ import annotations

import os
import subprocess
import time


def _queue_times(job_id: str) -> dict:
    """Submit and start times of a running job, from squeue (empty when it cannot say)."""
    try:
        done = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%V|%S"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return {}
    fields = done.stdout.strip().split("|")
    if done.returncode != 0 or len(fields) != 2:
        return {}
    try:
        submitted, started = (time.mktime(time.strptime(f, "%Y-%m-%dT%H:%M:%S")) for f in fields)
    except ValueError:
        return {}
    return {"submitted": fields[0], "started": fields[1], "waited_s": started - submitted}


def allocation(environ=None) -> dict:
    env = os.environ if environ is None else environ
    record = {"cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
              "visible_gpus": env.get("CUDA_VISIBLE_DEVICES")}
    job = env.get("SLURM_JOB_ID")
    if not job:
        return {"scheduler": None, **record}
    record.update(scheduler="slurm", job_id=job, partition=env.get("SLURM_JOB_PARTITION"), nodes=env.get("SLURM_JOB_NODELIST"),
                  cpus_per_task=env.get("SLURM_CPUS_PER_TASK"), memory_mb=env.get("SLURM_MEM_PER_NODE"), gpus=env.get("SLURM_GPUS_ON_NODE"),
                  tasks=env.get("SLURM_NTASKS"), restarts=env.get("SLURM_RESTART_COUNT", "0"))
    if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):  # a task of an array (submitit's): squeue knows it as A_T
        record["array_task"] = job = f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    return {**record, **_queue_times(job)}
