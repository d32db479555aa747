"""Issue 44's rehearsal of the cluster on a real scheduler: a single-node SLURM (Debian's slurm-wlm,
started by `slurm_cluster.SlurmCluster`) runs the documented cluster commands at tiny scale through
Hydra's real submitit SLURM launcher. Marked `cluster`: `make test-cluster` runs them (`.ci/run`
after `make test`); skipped with the reason where SLURM is not installed.

- a table sweep (three rows x two seeds, the hybrid needing dpr's model) in waves to the report,
  each job's allocation and queue wait recorded, no job waiting on a lock in its allocation;
- a job of several tasks (submitit's tasks_per_node=2) refused before any stage starts, where it
  used to deadlock;
- `srun -n 2 scripts/encode_passages.py`: one shard per task, where every task encoded everything;
- the same sweep run again submits no job.
"""

import json
import sys

import pytest
from conftest import ROOT
from slurm_cluster import SlurmCluster, missing
from test_experiment import prepared, records, report_of, squad4, tiny, waited  # noqa: F401 - squad4 is a fixture

pytestmark = [pytest.mark.cluster, pytest.mark.skipif(missing() is not None, reason=str(missing()))]

JOB_ENV = {"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
SLURM_CPU = ["hydra/launcher=slurm_cpu", "hydra.launcher.cpus_per_task=1", "hydra.launcher.mem_gb=2", "hydra.launcher.timeout_min=15"]
# each job class's resources (the table sweeper's launchers), told apart by their memory
CLASSES = ["hydra.sweeper.launchers.cpu={gpus_per_node:0,cpus_per_task:1,mem_gb:1,timeout_min:14}",
           "hydra.sweeper.launchers.evaluate={gpus_per_node:1,cpus_per_task:1,mem_gb:1,timeout_min:13}"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with SlurmCluster(tmp_path_factory.mktemp("slurm")) as running:
        yield running


def experiment(cluster, *args, timeout=1200):
    return cluster.run(sys.executable, str(ROOT / "scripts" / "experiment.py"), *args, check=False, timeout=timeout, cwd=ROOT, env=JOB_ENV)


def test_a_table_sweep_runs_as_slurm_jobs_in_waves_to_the_report(cluster, squad4, tiny_pretrained, tmp_path):  # noqa: F811
    """BM25, dpr and its hybrid at two seeds: the CPU stages in a prepare job first, the hybrids after
    dpr's jobs; no job ever waits on another's stage lock inside its allocation; the CPU and
    evaluation jobs on their own (smaller) resources."""
    sweep = tmp_path / "sweep"
    done = experiment(cluster, "-m", *tiny(squad4, tiny_pretrained, tmp_path / "stages"), "row=bm25,dpr,hybrid", "seed=1,2",
                      f"hydra.sweep.dir={sweep}", *SLURM_CPU, *CLASSES)
    assert done.returncode == 0, done.stderr[-4000:] + cluster.logs()
    recs = records(sweep)
    assert sorted(recs) == [("bm25", 1), ("bm25", 2), ("dpr", 1), ("dpr", 2), ("hybrid", 1), ("hybrid", 2)]
    trained = sum(1 for r in recs.values() for s in r["stages"] if s["stage"] == "train dpr" and s["built"])
    assert trained == 2  # dpr at each seed, once
    assert waited(sweep) == []  # before: the hybrids (and the second seed's job) waited on dpr's locks holding their allocations
    [prepare] = prepared(sweep)
    assert [s["stage"] for s in prepare["stages"] if s["built"]] == ["data", "questions", "BM25 index", "negatives"]
    memory = {("prepare", prepare["row"]): prepare["allocation"]["memory_mb"], **{key: r["allocation"]["memory_mb"] for key, r in recs.items()}}
    assert memory == {("prepare", "dpr"): "1024", ("bm25", 1): "1024", ("bm25", 2): "1024", ("dpr", 1): "2048", ("dpr", 2): "2048",
                      ("hybrid", 1): "1024", ("hybrid", 2): "1024"}  # cpu and evaluate classes: launchers.<class>; training: the sweep's
    for record in [*recs.values(), prepare]:
        allocation = record["allocation"]
        assert allocation["scheduler"] == "slurm" and allocation["job_id"] and allocation["cpus_per_task"] == "1"
        assert allocation["waited_s"] >= 0  # how long it queued, from squeue
    starts = {key: r["allocation"]["started"] for key, r in recs.items()}
    assert starts[("hybrid", 1)] >= max(starts[("dpr", 1)], starts[("dpr", 2)]) >= prepare["allocation"]["started"]
    assert "hybrid BM25 + dpr" in report_of(sweep, tmp_path)
    # the same command again: every job is found finished, none is submitted (before: all queued again for whole
    # allocations, only to find their stages done)
    submitted = {p.name for p in (sweep / ".submitit").iterdir() if p.is_dir()}
    again = experiment(cluster, "-m", *tiny(squad4, tiny_pretrained, tmp_path / "stages"), "row=bm25,dpr,hybrid", "seed=1,2",
                       f"hydra.sweep.dir={sweep}", *SLURM_CPU, *CLASSES)
    assert again.returncode == 0, again.stderr[-4000:]
    assert {p.name for p in (sweep / ".submitit").iterdir() if p.is_dir()} == submitted
    assert (again.stdout + again.stderr).count("found done, not submitted") == len(recs) + 1  # the rows' jobs and the prepare job


def test_a_job_of_several_tasks_is_refused_before_any_stage(cluster, squad4, tiny_pretrained, tmp_path):  # noqa: F811
    """submitit's tasks_per_node=2 used to run the row in both tasks: the lock holder then waited in
    init_process_group for a task waiting on that lock, 30 minutes per task."""
    done = experiment(cluster, "-m", *tiny(squad4, tiny_pretrained, tmp_path / "stages"), "row=dpr", "seed=1", f"hydra.sweep.dir={tmp_path / 'sweep'}",
                      *SLURM_CPU, "hydra.launcher.tasks_per_node=2", timeout=600)
    assert done.returncode != 0
    logs = "".join(p.read_text() for p in (tmp_path / "sweep" / ".submitit").rglob("*.err")) + done.stderr + done.stdout
    assert "every task would run the whole row" in logs and "tasks_per_node=1" in logs
    assert not (tmp_path / "stages").exists() or not any((tmp_path / "stages").iterdir())


def test_srun_tasks_encode_one_shard_each(cluster, tiny_pretrained, mini_squad, tmp_path):
    from taser.pipeline.experiment import save_initial

    checkpoint = save_initial({"pretrained": tiny_pretrained, "model_type": "shared", "max_length": 64}, tmp_path / "ckpt")
    out = tmp_path / "emb"
    done = cluster.run("srun", "-n", "2", "--cpus-per-task=1", sys.executable, str(ROOT / "scripts" / "encode_passages.py"),
                       f"checkpoint={checkpoint}", f"passages={mini_squad / 'passages.tsv'}", f"out_dir={out}", "precision=fp32", "device=cpu",
                       f"hydra.run.dir={tmp_path / 'run'}", check=False, timeout=600, cwd=ROOT, env=JOB_ENV)
    assert done.returncode == 0, done.stderr[-3000:]
    manifests = [json.loads(p.read_text()) for p in out.rglob("manifest.json")]
    assert sorted((m["shard_id"], m["num_shards"]) for m in manifests) == [(0, 2), (1, 2)]  # before: shard 0 of 1, twice
    assert manifests[0]["end"] - manifests[0]["start"] + manifests[1]["end"] - manifests[1]["start"] == max(m["end"] for m in manifests)

