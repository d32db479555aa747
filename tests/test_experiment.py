"""A paper's table in one command (`scripts/experiment.py`): a preset table at a tiny scale (tiny
model, 4 shipped articles, 2 rows x 2 seeds, one of them the hybrid that needs `dpr`'s model) through
Hydra's basic launcher and through submitit's local executor, ending with the report; the shared
stages are built once (spies and the jobs' records say so); a killed row resumes at its first
unfinished stage and ends with the uninterrupted run's results; every preset composes, names its
data, and carries its reference figures; a typo in a row's name is refused before anything loads."""

import json
import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, SQUAD
from hydra import compose, initialize_config_dir

from taser.cli import CONFIG_DIR, typed
from taser.pipeline.stages import DONE_FILE, StageStore, stage_key

PRESETS = sorted(p.stem for p in (ROOT / "configs" / "table").glob("*.yaml"))


@pytest.fixture(scope="module")
def squad4(tmp_path_factory) -> Path:
    data = json.loads(SQUAD.read_text())
    path = tmp_path_factory.mktemp("squad") / "squad-4.json"
    path.write_text(json.dumps({"version": "1.1", "data": data["data"][:4]}))
    return path


def tiny(squad4, pretrained, stages, seeds=(1, 2)) -> list[str]:
    """Overrides that shrink the SQuAD CPU preset to seconds."""
    return ["table=squad_cpu", f"table.data.squad_json={squad4}", "table.data.train_articles=3", "table.data.limit_questions=30",
            f"table.model.pretrained={pretrained}", "++table.model.max_length=64", "++table.model.max_question_length=32",
            "table.train.max_steps=3", "table.train.batch_size=2", "table.train.save_every=1", "table.train.warmup_steps=1",
            "++table.train.precision=fp32", "++table.train.device=cpu", "table.evaluate.precision=fp32", "table.evaluate.device=cpu",
            "table.evaluate.batch_size=32", "table.evaluate.bm25.backend=bm25s", f"table.seeds=[{','.join(map(str, seeds))}]",
            f"stages_dir={stages}"]


SWEEP = ["row=dpr,hybrid", "seed=1,2"]  # on the command line, over the table's own sweep


def run_script(args: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", **(env or {})}
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "experiment.py"), *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)


def records(sweep: Path) -> dict[tuple[str, int], dict]:
    found = {}
    for path in sweep.glob("*/seed-*/experiment.json"):
        record = json.loads(path.read_text())
        found[(record["row"], int(path.parent.name.removeprefix("seed-")))] = record
    return found


def prepared(sweep: Path) -> list[dict]:
    """The records of the sweep's prepare jobs (the CPU stages, built before the rows' jobs start)."""
    return [json.loads(p.read_text()) for p in sweep.glob("prepare/*/prepare.json")]


def built(recs: dict, label: str, sweep: Path | None = None) -> int:
    """How many jobs built the stage `label` (with `sweep`: its prepare jobs counted too)."""
    every = list(recs.values()) + (prepared(sweep) if sweep else [])
    return sum(1 for r in every for s in r["stages"] if s["stage"] == label and s["built"])


def waited(sweep: Path) -> list[tuple[str, str, float]]:
    """(job, stage, seconds) for every stage a job of the sweep waited for on another job's lock."""
    every = [(f"{r['row']}/{r['seed']}", r) for r in records(sweep).values()] + [(f"prepare {r['row']}", r) for r in prepared(sweep)]
    return [(name, s["stage"], s["waited_s"]) for name, r in every for s in r["stages"] if s["waited_s"] > 0]


def report_of(sweep: Path, tmp_path: Path) -> str:
    from taser.evaluation.comparison import StatsSettings
    from taser.evaluation.report import read_runs, write_report

    return write_report(read_runs([str(sweep)]), tmp_path / "report", [1, 20], ["nDCG@10"], "t", StatsSettings("dpr", resamples=99))["markdown"]


@pytest.mark.slow
def test_a_table_through_the_basic_launcher_builds_each_shared_stage_once(squad4, tiny_pretrained, tmp_path, monkeypatch):
    """Would catch a row that retrains what another row trained (the hybrid needs dpr at its seed), a
    seed that rebuilds the data or BM25's index, or results the report cannot read."""
    import taser.pipeline.train as train_module

    calls = []
    real = train_module.run_training
    monkeypatch.setattr(train_module, "run_training", lambda model, files, cfg, out, **k: calls.append(cfg["seed"]) or real(model, files, cfg, out, **k))
    from taser.reader.model import Reader

    reader = tmp_path / "reader"
    Reader.from_pretrained(tiny_pretrained, 64, 16).save(reader)  # untrained: the reading stage's plumbing, not its EM
    sweep = tmp_path / "sweep"
    monkeypatch.setattr(sys, "argv", ["experiment.py", "-m", *tiny(squad4, tiny_pretrained, tmp_path / "stages"), *SWEEP, f"hydra.sweep.dir={sweep}",
                                      f"table.read.reader={reader}", "table.read.ks=[1,5]", "table.read.precision=fp32", "table.read.device=cpu"])
    runpy.run_path(str(ROOT / "scripts" / "experiment.py"), run_name="__main__")
    assert sorted(calls) == [1, 2]  # dpr at each seed, once: the hybrid found it
    recs = records(sweep)
    assert sorted(recs) == [("dpr", 1), ("dpr", 2), ("hybrid", 1), ("hybrid", 2)]
    assert built(recs, "data", sweep) == 1 and built(recs, "BM25 index", sweep) == 1 and built(recs, "train dpr") == 2 and built(recs, "index dpr") == 2
    assert [(r["row"], [s["stage"] for s in r["stages"]]) for r in prepared(sweep)] == [("dpr", ["data", "questions", "BM25 index", "negatives"])]
    assert all(s["built"] for r in prepared(sweep) for s in r["stages"])  # the CPU stages only, each built there
    assert waited(sweep) == []
    assert all(not s["built"] for s in recs[("hybrid", 2)]["stages"] if s["stage"] not in ("evaluate", "read"))
    results = json.loads((sweep / "hybrid" / "seed-2" / "retrieval" / "results.json").read_text())
    assert results["seed"] == 2 and results["name"] == "hybrid BM25 + dpr" and (sweep / "hybrid" / "seed-2" / "retrieval" / "per_query.jsonl").is_file()
    assert (sweep / "hybrid" / "seed-2" / "retrieval" / "retrieval.json").is_file()  # the passages, for report.py inspect=...
    assert recs[("dpr", 1)]["machine"] and "table" in recs[("dpr", 1)]["job"] and recs[("dpr", 1)]["commit"]
    reading = json.loads((sweep / "hybrid" / "seed-2" / "reader" / "results.json").read_text())
    assert reading["task"] == "reader" and set(reading["em"]) == {"1", "5"} and reading["retriever"] == "hybrid BM25 + dpr"
    assert built(records(sweep), "read") == 4  # one reading of each (row, seed)'s retrieval
    text = report_of(sweep, tmp_path)
    assert "hybrid BM25 + dpr" in text and "dpr" in text and "| 2 |" in text and "EM@1" in text  # two seeds per system; the reader's EM
    # the same command again: no job is run (each is found finished, its stages done), nothing is built
    calls.clear()
    written = {p: p.stat().st_mtime_ns for p in [*sweep.glob("*/seed-*/experiment.json"), *sweep.glob("prepare/*/prepare.json")]}
    runpy.run_path(str(ROOT / "scripts" / "experiment.py"), run_name="__main__")
    assert calls == [] and {p: p.stat().st_mtime_ns for p in written} == written
    # a stage removed: its builder's job runs again and builds it once; the hybrid that used it, a wave later, finds it done again
    index = next(s for s in recs[("dpr", 2)]["stages"] if s["stage"] == "index dpr")
    assert index["key"] in (sweep / "hybrid" / "seed-2" / "experiment.json").read_text()
    (Path(index["dir"]) / "stage.json").unlink()
    runpy.run_path(str(ROOT / "scripts" / "experiment.py"), run_name="__main__")
    assert {p for p in written if p.stat().st_mtime_ns != written[p]} == {sweep / "dpr" / "seed-2" / "experiment.json"}
    assert calls == [] and [s["stage"] for s in records(sweep)[("dpr", 2)]["stages"] if s["built"]] == ["index dpr"]


@pytest.mark.rehearsal
@pytest.mark.slow
def test_a_table_through_submitits_local_executor(squad4, tiny_pretrained, tmp_path):
    """The same table as one submitit job per (row, seed), as on a SLURM cluster, running at once:
    the stage locks keep two jobs from building one stage."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    sweep = tmp_path / "sweep"
    done = run_script(["-m", *tiny(squad4, tiny_pretrained, tmp_path / "stages"), *SWEEP, f"hydra.sweep.dir={sweep}", "hydra/launcher=submitit_local",
                       "hydra.launcher.timeout_min=10"])
    assert done.returncode == 0, done.stderr[-3000:]
    recs = records(sweep)
    assert sorted(recs) == [("dpr", 1), ("dpr", 2), ("hybrid", 1), ("hybrid", 2)]
    assert built(recs, "train dpr") == 2 and built(recs, "data", sweep) == 1 and built(recs, "BM25 index", sweep) == 1
    assert waited(sweep) == []  # in waves: the hybrids start after dpr's jobs, the rows after the prepare job
    assert "hybrid BM25 + dpr" in report_of(sweep, tmp_path)


def test_stage_keys_follow_what_matters():
    base = stage_key("train", {"lr": 1e-5, "seed": 1}, {"data": "x"})
    assert base == stage_key("train", {"seed": 1, "lr": 1e-5}, {"data": "x"})  # order does not matter
    assert len({base, stage_key("train", {"lr": 2e-5, "seed": 1}, {"data": "x"}), stage_key("train", {"lr": 1e-5, "seed": 2}, {"data": "x"}),
                stage_key("train", {"lr": 1e-5, "seed": 1}, {"data": "y"}), stage_key("dense-index", {"lr": 1e-5, "seed": 1}, {"data": "x"})}) == 5


def test_the_training_key_ignores_where_and_how_loudly(squad4, tiny_pretrained, tmp_path):
    """Output directory, logging and progress do not change the trained weights, so not the key."""
    from taser.pipeline.rows import RowRun

    keys = set()
    for extra in ([], ["table.train.save_every=7", "++table.train.log_every=3", "table.train.progress=true", "progress=true"]):
        job = job_of(tiny(squad4, tiny_pretrained, tmp_path / "stages") + extra + ["row=dpr", "out_dir=/elsewhere"])
        run = RowRun(job)
        run.train_files = lambda row, seed: ([], ["train-key"])
        run.stage = lambda label, kind, settings, inputs, build, owner=None: keys.add(stage_key(kind, settings, inputs))
        run.trained(job.table.rows["dpr"], 1)
    assert len(keys) == 1
    job = job_of(tiny(squad4, tiny_pretrained, tmp_path / "stages") + ["row=dpr", "table.train.learning_rate=0.001"])
    run = RowRun(job)
    run.train_files = lambda row, seed: ([], ["train-key"])
    run.stage = lambda label, kind, settings, inputs, build, owner=None: keys.add(stage_key(kind, settings, inputs))
    run.trained(job.table.rows["dpr"], 1)
    assert len(keys) == 2  # a setting that matters: a new key


def job_of(overrides: list[str]):
    """The typed job of these overrides, composed as the script composes it (without Hydra's own settings)."""
    kept = [o for o in overrides if not o.startswith("hydra.")]
    if not any(o.startswith("out_dir=") for o in kept):
        kept.append("out_dir=/tmp/unused")
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose("experiment", overrides=kept)
    return typed(cfg)


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_composes_names_its_data_and_carries_reference_figures(preset):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose("experiment", overrides=[f"table={preset}", "row=" + _first_row(preset), "out_dir=/tmp/unused"], return_hydra_config=True)
    from omegaconf import OmegaConf, open_dict

    sweep = OmegaConf.to_container(cfg.hydra.sweeper.params)
    with open_dict(cfg):
        del cfg["hydra"]
    job = typed(cfg)
    table = job.table
    readers = sorted(key for key, row in table.rows.items() if row.kind == "reader")
    config = (ROOT / "configs" / "table" / f"{preset}.yaml").read_text()
    documented = [line for line in config.splitlines() if line.startswith("# python scripts/experiment.py")]
    swept = sorted(sweep["row"].split(","))
    if readers and not set(readers) <= set(swept):  # reader rows left to a command of their own, which the config documents
        rows_of = [next((a.removeprefix("row=").split(",") for a in line.split() if a.startswith("row=")), []) for line in documented]
        assert any(sorted(rows) == readers for rows in rows_of), "the table's reader rows have a documented command"
        swept = sorted(swept + readers)
    assert swept == sorted(table.rows), "the sweep runs every row of the table"
    assert [int(s) for s in str(sweep["seed"]).split(",")] == table.seeds
    assert table.data.kind == "squad" or table.data.resources, "a table of downloaded data names its resources"
    assert table.reference_source
    if table.data.kind != "squad":
        assert any(row.reference for row in table.rows.values()), "a paper's table carries the paper's figures"
    from taser.data.resources import RESOURCES

    assert set(table.data.resources) <= set(RESOURCES)


def _first_row(preset: str) -> str:
    import yaml

    return next(iter(yaml.safe_load((ROOT / "configs" / "table" / f"{preset}.yaml").read_text())["table"]["rows"]))


def test_a_typo_in_a_row_or_a_table_is_refused_before_anything_loads(squad4, tiny_pretrained, tmp_path):
    with pytest.raises(ValueError, match=r"unknown row 'dpx' in table squad_cpu; its rows: zero-shot, bm25"):
        job_of(tiny(squad4, tiny_pretrained, tmp_path) + ["row=dpx"])
    done = run_script(["table=squad_cpu", "row=dpx", f"hydra.run.dir={tmp_path / 'run'}"])
    assert done.returncode != 0 and "unknown row 'dpx'" in done.stderr and "import torch" not in done.stderr
    done = run_script(["table=squad_cpux", "row=dpr", f"hydra.run.dir={tmp_path / 'run'}"])
    assert done.returncode != 0 and "squad_cpux" in done.stderr and "Available options" in done.stderr


def test_a_half_built_stage_is_not_taken_as_done_and_a_lock_of_a_dead_process_is_taken_over(tmp_path):
    store = StageStore(tmp_path, poll_s=0.01)
    calls = []

    def fails(d):
        calls.append(d)
        (d / "half.txt").write_text("half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        store.run("squad", {"a": 1}, {}, fails)
    key = stage_key("squad", {"a": 1}, {})
    assert not store.done(key) and (store.dir(key) / "half.txt").is_file()
    (tmp_path / f"{key}.lock").write_text(json.dumps({"host": os.uname().nodename, "pid": 2**22 + 12345, "since": 0}))  # a dead process's
    stage = store.run("squad", {"a": 1}, {}, lambda d: calls.append(d))
    assert stage.built and len(calls) == 2 and (stage.dir / DONE_FILE).is_file() and not (tmp_path / f"{key}.lock").exists()
    assert not store.run("squad", {"a": 1}, {}, lambda d: calls.append(d)).built and len(calls) == 2


KILLER = '''
import os, runpy, signal, sys
where = os.environ.get("KILL_AT")
if where == "train":  # right after the checkpoint of step 2 (of 3) is written
    import taser.training.trainer as trainer
    real_save = trainer.Trainer._save
    def _save(self, loop, step):
        real_save(self, loop, step)
        if step == 2:
            os.kill(os.getpid(), signal.SIGKILL)
    trainer.Trainer._save = _save
elif where == "encode":  # right after the first chunk of passage vectors is written
    import taser.retrieval.embeddings as embeddings
    real_write = embeddings.ShardWriter.write_chunk
    def write_chunk(self, i, *args):
        real_write(self, i, *args)
        if i == 0:
            os.kill(os.getpid(), signal.SIGKILL)
    embeddings.ShardWriter.write_chunk = write_chunk
sys.argv = [sys.argv[1]] + sys.argv[2:]
sys.path.insert(0, os.path.dirname(sys.argv[0]))  # as `python scripts/x.py` has it
runpy.run_path(sys.argv[0], run_name="__main__")
'''


@pytest.mark.rehearsal
@pytest.mark.slow
def test_a_row_killed_mid_training_and_mid_encoding_resumes_to_the_uninterrupted_results(squad4, tiny_pretrained, tmp_path):
    """Would catch a killed stage taken as done, a finished stage redone, training restarted from
    step 0 instead of its checkpoint, or an encoding that does not continue from its chunks."""
    killer = tmp_path / "killer.py"
    killer.write_text(KILLER)
    common = [*tiny(squad4, tiny_pretrained, tmp_path / "stages"), "table.evaluate.chunk_size=60", "row=dpr", "seed=1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}

    def run(kill: str | None, out: Path, stages: Path):
        args = [sys.executable, str(killer), str(ROOT / "scripts" / "experiment.py"), *common, f"stages_dir={stages}", f"hydra.run.dir={out}"]
        return subprocess.run(args, cwd=ROOT, env={**env, **({"KILL_AT": kill} if kill else {})}, capture_output=True, text=True, timeout=600)

    assert run("train", tmp_path / "run", tmp_path / "stages").returncode == -9
    assert not (tmp_path / "run" / "retrieval" / "results.json").exists()
    second = run("encode", tmp_path / "run", tmp_path / "stages")
    assert second.returncode == -9 and "resumed from" in second.stderr and "at step 2 of 3" in second.stderr  # training went on from its checkpoint
    finished = run(None, tmp_path / "run", tmp_path / "stages")
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert "continuing" in finished.stderr  # the encoding went on from its first chunk
    record = json.loads((tmp_path / "run" / "experiment.json").read_text())
    built_now = {s["stage"] for s in record["stages"] if s["built"]}
    assert built_now == {"index dpr", "evaluate"}  # data, BM25, negatives and training: not redone
    train_dir = next(Path(s["dir"]) for s in record["stages"] if s["stage"] == "train dpr")
    steps = [json.loads(line)["step"] for line in (train_dir / "train_log.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]  # one line per step: steps 1-2 kept from before the kill, step 3 after the resume
    uninterrupted = run(None, tmp_path / "whole", tmp_path / "stages-whole")
    assert uninterrupted.returncode == 0, uninterrupted.stderr[-3000:]
    a, b = (json.loads((tmp_path / d / "retrieval" / "results.json").read_text()) for d in ("run", "whole"))
    assert a["top_k"] == b["top_k"] and set(a["top_k"]) >= {"1", "20"}
    assert (tmp_path / "run" / "retrieval" / "per_query.jsonl").read_text() == (tmp_path / "whole" / "retrieval" / "per_query.jsonl").read_text()


@pytest.mark.parametrize("launcher, target, gpus", [("slurm_gpu", "SlurmLauncher", 1), ("slurm_8gpu", "SlurmLauncher", 8),
                                                    ("slurm_cpu", "SlurmLauncher", 0), ("local_parallel", "JoblibLauncher", None)])
def test_launcher_presets_compose(launcher, target, gpus):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose("experiment", overrides=["table=dpr_nq", "row=dpr", f"hydra/launcher={launcher}"], return_hydra_config=True)
    assert cfg.hydra.launcher._target_.endswith(target)
    if gpus is not None:
        assert cfg.hydra.launcher.gpus_per_node == gpus and cfg.hydra.launcher.timeout_min > 0 and cfg.hydra.launcher.mem_gb > 0
        assert cfg.hydra.launcher.max_num_timeout >= 1  # a timed-out job is requeued: every stage resumes
        assert "export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK" in cfg.hydra.launcher.setup  # SLURM 22.05+: else one core
    if gpus:  # a GPU row evaluates with the flat index of 21M passages in memory
        from taser.retrieval.index_types import IndexConfig, estimates

        assert cfg.hydra.launcher.mem_gb > estimates(IndexConfig("flat"), 768, 21_015_324)["flat"] * 1.5


def test_the_report_sets_each_row_beside_its_papers_figures(tmp_path):
    from taser.evaluation.report import read_runs, reference_table

    for seed, top20 in ((1, 70.0), (2, 72.0)):
        d = tmp_path / f"dpr-{seed}"
        d.mkdir()
        (d / "results.json").write_text(json.dumps({"task": "qa", "dataset": "NQ", "name": "DPR", "seed": seed,
                                                    "top_k": {"20": top20, "100": 80.0}, "reference": {"top20": 78.4, "top100": None}}))
    runs = read_runs([str(tmp_path)])
    table = reference_table(runs)
    assert "| DPR | NQ | top-20 | 78.4 | 71.0 (2 run(s)) | -7.4 |" in table and "top-100" not in table  # not reported: no row
    from taser.evaluation.report import report_markdown

    assert "## Beside the papers' figures\n\n" + table in report_markdown(runs, {})  # the report carries the section


def test_a_row_without_training_reports_once_with_the_first_seed(squad4, tiny_pretrained, tmp_path, monkeypatch):
    """Would catch BM25 or zero-shot written at every seed of a sweep (the report would count one
    seedless system several times) or at none."""
    from taser.pipeline import rows
    from taser.pipeline.stages import Stage

    evaluated = tmp_path / "evaluated"
    evaluated.mkdir()
    (evaluated / "results.json").write_text(json.dumps({"task": "qa", "dataset": "SQuAD", "name": "BM25", "top_k": {"1": 50.0}}))
    (evaluated / "per_query.jsonl").write_text(json.dumps({"id": "0", "rank": 1}) + "\n")
    monkeypatch.setattr(rows.RowRun, "evaluate", lambda self, row, seed: Stage("evaluate-x", evaluated, False, 0.0))
    for seed in (1, 2):
        rows.run_row(job_of(tiny(squad4, tiny_pretrained, tmp_path / "stages") + ["row=bm25", f"seed={seed}", f"out_dir={tmp_path / str(seed)}"]))
    assert (tmp_path / "1" / "retrieval" / "results.json").is_file() and not (tmp_path / "2" / "retrieval").exists()
    assert "reports once, with the table's first seed (1)" in json.loads((tmp_path / "2" / "experiment.json").read_text())["results"]


@pytest.mark.rehearsal
@pytest.mark.slow
def test_a_rows_training_stage_runs_under_torchrun_with_several_processes(squad4, tiny_pretrained, tmp_path):
    """processes=2 (as a job with 2 GPUs would by default): the training stage runs torchrun with one
    rank each (here gloo on the CPU) and the row ends with its results."""
    done = run_script([*tiny(squad4, tiny_pretrained, tmp_path / "stages"), "row=dpr", "seed=1", "processes=2", f"hydra.run.dir={tmp_path / 'run'}"],
                      env={**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TASER_DIST_INIT": f"file://{tmp_path / 'rendezvous'}"})
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads((tmp_path / "run" / "experiment.json").read_text())
    train_dir = next(Path(s["dir"]) for s in record["stages"] if s["stage"] == "train dpr")
    summary = json.loads((train_dir / "train_summary.json").read_text())
    assert summary["steps"] == 3 and (train_dir / "final" / "model.safetensors").is_file() and not (train_dir / "checkpoint").exists()
    assert "training on 2 processes" in done.stderr and (tmp_path / "run" / "retrieval" / "results.json").is_file()
    assert "encoding the passages on 2 processes" in done.stderr  # the index too, one shard per process


def test_a_lock_goes_stale_only_when_its_holder_stops_touching_it(tmp_path, lock_clock):
    """Would catch a lock of a job killed on another node (no pid to check) waited on for ever, a live
    holder's lock taken over, or a holder removing a lock that is no longer its own."""

    from taser.pipeline.stages import _FileLock

    path = tmp_path / "x.lock"
    path.write_text(json.dumps({"host": "another-node", "pid": 1, "since": 0, "token": "theirs"}))
    lock = _FileLock(path, poll_s=0.01, stale_after_s=60)
    assert not lock._stale()  # just seen: alive as far as anyone can tell
    lock_clock.advance(50)
    os.utime(path)  # its holder touched it
    assert not lock._stale()
    lock_clock.advance(59)
    assert not lock._stale()  # 59 s since it last changed
    lock_clock.advance(2)
    assert lock._stale() and lock._break_if_stale() and not path.exists()
    with lock:
        assert json.loads(path.read_text())["token"] == lock.token
        path.write_text(json.dumps({"host": "another-node", "pid": 1, "token": "someone else"}))  # taken over while this one was stalled
    assert path.exists() and json.loads(path.read_text())["token"] == "someone else"  # not removed by the former holder


def test_answers_are_highlighted_without_breaking_the_page():
    from taser.evaluation.inspect_page import _highlight

    assert _highlight("Joan's 27 cats & A dogs", ["27", "a"]) == "Jo<mark>a</mark>n&#x27;s <mark>27</mark> c<mark>a</mark>ts &amp; <mark>A</mark> dogs"
    assert _highlight("<b>Paris</b>", ["paris"]) == "&lt;b&gt;<mark>Paris</mark>&lt;/b&gt;"
