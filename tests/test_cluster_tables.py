"""Issue 44's rehearsal of the paper's tables on a real single-node SLURM: the documented commands of
`dpr_table3` and `dpr_nq` (their configs' own comment lines), at tiny scale, to the report: every row,
two seeds, each job's allocation and queue wait recorded, no job waiting on a lock in its allocation.

Tiny scale: DPR's files laid out under a data_dir at DPR's names, made from four SQuAD articles (the
training questions' random negatives serve as BM25's hard negatives); a tiny random BERT; `smoke_steps`;
BM25 by bm25s. The GPU launchers' CPU twins: the same presets with no GPU, and `dpr_nq`'s 8 GPUs as 2
torchrun ranks on the CPU (`processes=2`). Then a cancel: `scancel` of every job while dpr trains, and
the same command again finishes the table without rebuilding what was done (the driver itself is
stopped by hand: it learns of a cancel through SLURM's accounting, which this cluster does not run).
"""

import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT
from slurm_cluster import SlurmCluster, missing
from test_experiment import prepared, records, squad4, waited  # noqa: F401 - squad4 is a fixture

pytestmark = [pytest.mark.cluster, pytest.mark.skipif(missing() is not None, reason=str(missing()))]

JOB_ENV = {"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
CLASSES = ["hydra.sweeper.launchers.cpu={gpus_per_node:0,cpus_per_task:1,mem_gb:1,timeout_min:14}",
           "hydra.sweeper.launchers.evaluate={gpus_per_node:1,cpus_per_task:1,mem_gb:1,timeout_min:13}"]
CPU_TWIN = {"slurm_gpu": ["hydra.launcher.gpus_per_node=0", "hydra.launcher.cpus_per_task=1", "hydra.launcher.mem_gb=2", "hydra.launcher.timeout_min=20"],
            "slurm_8gpu": ["hydra.launcher.gpus_per_node=0", "hydra.launcher.cpus_per_task=2", "hydra.launcher.mem_gb=3", "hydra.launcher.timeout_min=20",
                           "processes=2"]}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with SlurmCluster(tmp_path_factory.mktemp("slurm")) as running:
        yield running


@pytest.fixture(scope="module")
def dpr_files(squad4, tmp_path_factory) -> Path:  # noqa: F811
    """DPR's files at DPR's names under a data_dir, from four SQuAD articles."""
    from taser.data.squad import convert_squad

    made = tmp_path_factory.mktemp("squad-as-dpr")
    convert_squad(squad4, made, train_articles=3)
    root = tmp_path_factory.mktemp("dpr")
    (root / "data" / "retriever" / "qas").mkdir(parents=True)
    (root / "data" / "wikipedia_split").mkdir(parents=True)
    train = json.loads((made / "train.json").read_text())
    for record in train:
        record["hard_negative_ctxs"] = record["negative_ctxs"][:7]  # DPR's files carry BM25's hard negatives
    for name in ("nq", "trivia", "webq", "curatedtrec"):
        (root / "data" / "retriever" / f"{name}-train.json").write_text(json.dumps(train))
    for split in ("dev", "test"):
        (root / "data" / "retriever" / "qas" / f"nq-{split}.csv").write_text((made / "dev.qa.tsv").read_text())
    (root / "data" / "wikipedia_split" / "psgs_w100.tsv").write_text((made / "passages.tsv").read_text())
    return root


def documented_command(table: str) -> list[str]:
    """The table's own documented command line (its config's comment), as arguments of experiment.py."""
    line = next(line for line in (ROOT / "configs" / "table" / f"{table}.yaml").read_text().splitlines()
                if line.startswith("# python scripts/experiment.py -m"))
    return shlex.split(line.removeprefix("# python scripts/experiment.py "))


def tiny_command(table: str, data_dir: Path, pretrained: str, out: Path) -> list[str]:
    args = [a.replace("/data/dpr", str(data_dir)) for a in documented_command(table)]
    launcher = next(a.split("=", 1)[1] for a in args if a.startswith("hydra/launcher="))
    return [sys.executable, str(ROOT / "scripts" / "experiment.py"), *args, *CPU_TWIN[launcher], *CLASSES,
            "smoke_steps=2", f"table.model.pretrained={pretrained}", "table.model.max_length=64", "++table.model.max_question_length=32",
            "++table.train.precision=fp32", "++table.train.device=cpu", "table.evaluate.precision=fp32", "table.evaluate.device=cpu",
            "table.evaluate.batch_size=32", "table.evaluate.bm25.backend=bm25s", "table.seeds=[1,2]", "seed=1,2",
            f"stages_dir={out / 'stages'}", f"hydra.sweep.dir={out / 'sweep'}"]


def report(sweep: Path, out: Path) -> str:
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "report.py"), f"runs=[{sweep}]", f"out_dir={out}", "resamples=99",
                           f"hydra.run.dir={out / 'hydra'}"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return (out / "report.md").read_text()


def check_table(table: str, out: Path) -> dict:
    from taser.sweeps.plan import compose_job

    spec = compose_job(table).table
    recs = records(out / "sweep")
    assert sorted(recs) == sorted((row, seed) for row in spec.rows for seed in (1, 2))
    assert waited(out / "sweep") == []
    for record in [*recs.values(), *prepared(out / "sweep")]:
        allocation = record["allocation"]
        assert allocation["scheduler"] == "slurm" and allocation["job_id"] and allocation["waited_s"] >= 0
    text = report(out / "sweep", out / "report")
    for row in spec.rows.values():
        assert row.name in text
    return recs


def test_dpr_table3_documented_command_runs_every_row_at_two_seeds(cluster, dpr_files, tiny_pretrained, tmp_path):
    done = cluster.run(*tiny_command("dpr_table3", dpr_files, tiny_pretrained, tmp_path), check=False, timeout=1800, cwd=ROOT, env=JOB_ENV)
    assert done.returncode == 0, done.stderr[-4000:] + cluster.logs()
    recs = check_table("dpr_table3", tmp_path)
    assert all(r["allocation"]["memory_mb"] == "2048" for r in recs.values())  # every row trains: the sweep's launcher
    schedule = json.loads((tmp_path / "sweep" / "schedule.json").read_text())
    assert len(schedule["waves"]) == 2 and list(schedule["waves"][0]) == ["cpu"]  # the questions and passages subsets first


def test_dpr_nq_documented_command_cancelled_mid_training_then_rerun(cluster, dpr_files, tiny_pretrained, tmp_path):
    command = [*tiny_command("dpr_nq", dpr_files, tiny_pretrained, tmp_path), "table.train.save_every=1"]  # a checkpoint from step 1 on
    driver = subprocess.Popen(["bash", "-c", " ".join(map(shlex.quote, command))], cwd=ROOT, env={**cluster.env, **JOB_ENV},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    stages = tmp_path / "stages"
    deadline = time.time() + 900
    while time.time() < deadline and not any(stages.glob("train-*/checkpoint")):  # a training stage has saved a step
        assert driver.poll() is None, driver.stdout.read()[-4000:]
        # a training of smoke_steps lives a second or two on an idle machine, and its checkpoint/ goes once final/ is written
        assert not all((d / "stage.json").is_file() for d in stages.glob("train-*")) or len(list(stages.glob("train-*"))) < 4, (
            "every training finished before the poll saw a checkpoint: nothing left to cancel mid-training")
        time.sleep(0.05)
    assert any(stages.glob("train-*/checkpoint")), cluster.logs()
    cluster.run("scancel", "--user", "root")
    cluster.wait_idle(timeout=120)
    # The sweep's driver learns that a job was cancelled from sacct (SLURM's accounting); this rehearsal
    # cluster runs without slurmdbd, so submitit would wait for the cancelled jobs for ever: stopped here as
    # a user stops a command (SIGTERM). With accounting, the driver fails on its own, naming the lost jobs.
    driver.terminate()
    assert driver.wait(timeout=120) != 0
    before = {p.parent.name for p in stages.glob("*/stage.json")}
    # submitit bypasses SIGTERM (it requeues on its own signal), so a cancelled job ends by SIGKILL: a lock it held
    # remains, but its holder is gone, and the rerun takes it over at once
    for lock in stages.glob("*.lock"):
        owner = json.loads(lock.read_text() or "{}")
        assert not owner or not Path(f"/proc/{owner['pid']}").exists(), f"{lock}: its holder still runs"
    finished = {p: p.stat().st_mtime_ns for p in [*(tmp_path / "sweep").glob("*/seed-*/experiment.json"),
                                                   *(tmp_path / "sweep").glob("prepare/*/prepare.json")]}
    again = cluster.run(*command, check=False, timeout=1800, cwd=ROOT, env=JOB_ENV)
    assert again.returncode == 0, again.stderr[-4000:] + cluster.logs()
    recs = check_table("dpr_nq", tmp_path)
    rerun = [json.loads(p.read_text()) for p in [*(tmp_path / "sweep").glob("*/seed-*/experiment.json"), *(tmp_path / "sweep").glob("prepare/*/prepare.json")]
             if finished.get(p) != p.stat().st_mtime_ns]  # the jobs the rerun ran (those that had finished are not submitted again)
    assert len(rerun) < len(recs) + len(prepared(tmp_path / "sweep"))
    assert (again.stdout + again.stderr).count("found done, not submitted") == len(finished)
    rebuilt = [s["key"] for r in rerun for s in r["stages"] if s["built"] and s["key"] in before]
    assert rebuilt == []  # what was done before the cancel is found, not built again
    trained = [r for r in recs.values() if r["row"] in ("dpr", "dpr-multi")]
    assert {r["allocation"]["cpus_per_task"] for r in trained} == {"2"}  # the 8-GPU preset's twin: 2 ranks in one job
    assert {r["allocation"]["memory_mb"] for r in recs.values() if r["row"] in ("bm25", "hybrid")} == {"1024"}  # cpu, evaluate classes
