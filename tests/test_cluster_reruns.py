"""Reruns on a real scheduler (a single-node SLURM, `slurm_cluster.SlurmCluster`, through Hydra's submitit SLURM
launcher; marked `cluster`: `make test-cluster`): a sweep whose driver is killed mid-wave and run again leaves no
job waiting on another's lock, and a job requeued by SLURM resumes its stage and ends equal to an uninterrupted
run (a finished sweep run again submitting no job: tests/test_cluster.py). A module of its own, so that `make test-cluster` runs it beside the
others."""

import sys

import pytest
from conftest import ROOT
from slurm_cluster import SlurmCluster, missing
from test_cluster import CLASSES, JOB_ENV, SLURM_CPU, experiment
from test_experiment import records, squad4, tiny, waited  # noqa: F401 - squad4 is a fixture

pytestmark = [pytest.mark.cluster, pytest.mark.skipif(missing() is not None, reason=str(missing()))]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with SlurmCluster(tmp_path_factory.mktemp("slurm")) as running:
        yield running


def _squeue(cluster, *fields) -> list[list[str]]:
    done = cluster.run("squeue", "-h", "-o", " ".join(fields), check=False)
    return [line.split() for line in done.stdout.splitlines() if line.strip()]


def test_a_sweep_whose_driver_is_killed_mid_wave_and_rerun_leaves_no_job_waiting(cluster, squad4, tiny_pretrained, tmp_path):  # noqa: F811
    """The driver is lost (ssh drop) while dpr trains in its SLURM job; the same command again must not
    queue a second dpr job to wait on the first one's lock: it waits for it in the driver, then goes on."""
    import os
    import signal
    import subprocess
    import time

    sweep, stages = tmp_path / "sweep", tmp_path / "stages"
    args = [sys.executable, str(ROOT / "scripts" / "experiment.py"), "-m", *tiny(squad4, tiny_pretrained, stages, seeds=(1,)), "row=dpr,hybrid",
            "seed=1", "table.train.max_steps=400", "table.train.save_every=50", f"hydra.sweep.dir={sweep}", *SLURM_CPU, *CLASSES]
    driver = subprocess.Popen(args, cwd=ROOT, env={**cluster.env, **JOB_ENV}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 600
    while not list(stages.glob("train-*/stage-request.json")):
        assert driver.poll() is None and time.time() < deadline, "the driver ended before dpr's training started"
        time.sleep(0.2)
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait()
    running = {fields[0] for fields in _squeue(cluster, "%i")}
    assert running, "dpr's job ended before the driver was killed: nothing was left running"
    again = experiment(cluster, *args[2:])
    assert again.returncode == 0, again.stderr[-4000:] + cluster.logs()
    recs = records(sweep)
    assert sorted(recs) == [("dpr", 1), ("hybrid", 1)]
    assert recs[("dpr", 1)]["allocation"]["job_id"] in {r.split("_")[0] for r in running} | running  # the first driver's job finished it
    assert waited(sweep) == []  # no job of either driver waited on another's lock inside its allocation
    assert sum(1 for r in recs.values() for s in r["stages"] if s["stage"] == "train dpr" and s["built"]) == 1


def test_a_job_requeued_by_slurm_resumes_its_stage_and_ends_as_an_uninterrupted_run(cluster, squad4, tiny_pretrained, tmp_path):  # noqa: F811
    import subprocess
    import time

    from safetensors.torch import load_file

    def args(name):
        return [sys.executable, str(ROOT / "scripts" / "experiment.py"), "-m", *tiny(squad4, tiny_pretrained, tmp_path / name / "stages", seeds=(1,)),
                "row=dpr", "seed=1", "table.train.max_steps=600", "table.train.save_every=10", f"hydra.sweep.dir={tmp_path / name / 'sweep'}",
                *SLURM_CPU]

    straight = experiment(cluster, *args("straight")[2:])
    assert straight.returncode == 0, straight.stderr[-4000:]
    driver = subprocess.Popen(args("requeued"), cwd=ROOT, env={**cluster.env, **JOB_ENV}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 600
    stages = tmp_path / "requeued" / "stages"
    while not list(stages.glob("train-*/checkpoint/trainer_state.pt")):
        assert driver.poll() is None and time.time() < deadline, "the training ended before a checkpoint was seen"
        time.sleep(0.2)
    [[job]] = _squeue(cluster, "%i")
    cluster.run("scontrol", "requeue", job)
    assert driver.wait(timeout=900) == 0, driver.stdout.read()[-4000:] + cluster.logs()
    logs = "".join(p.read_text() for p in (tmp_path / "requeued" / "sweep" / ".submitit").rglob("*.err"))
    assert "resumed from" in logs, logs[-3000:]  # the requeued run continued from its checkpoint, not from step 0
    [ours] = list(stages.glob("train-*/final/model.safetensors"))
    [theirs] = list((tmp_path / "straight" / "stages").glob("train-*/final/model.safetensors"))
    assert ours.parent.parent.name == theirs.parent.parent.name  # one recipe, one key
    a, b = load_file(str(ours)), load_file(str(theirs))
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)
