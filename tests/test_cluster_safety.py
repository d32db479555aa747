"""Issue 44's smaller items that one CPU can show: a rank's CUDA random state saved and restored as
its own GPU's (item 5), rendezvous ports outside Linux's ephemeral range (item 9), two torchrun
ranks refused one visible GPU (item 9), and a job of several SLURM tasks refused before any stage
starts (item 1)."""

import os

import pytest
import torch
from test_experiment import squad4  # noqa: F401 - a fixture

from taser.training import checkpoint
from taser.training.distributed import PORT_BASE, master_port


def test_rendezvous_ports_stay_below_the_ephemeral_range():
    ports = {master_port(job, step) for job in range(0, 200_000, 7) for step in (0, 1, 5)}
    assert min(ports) >= PORT_BASE and max(ports) < 32768  # before: up to 39999, a third of job ids in 32768-60999


class FakeCuda:
    def __init__(self, device: int):
        self.device, self.restored = device, []

    def install(self, monkeypatch):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: self.device)
        monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device="cuda": torch.tensor([self.device], dtype=torch.uint8))
        monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: pytest.fail("every visible GPU's state saved"))
        monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, device="cuda": self.restored.append(int(state[0])))
        monkeypatch.setattr(torch.cuda, "set_rng_state_all", lambda states: pytest.fail("restored by index"))


def test_a_rank_saves_and_restores_its_own_gpus_random_state(monkeypatch):
    FakeCuda(3).install(monkeypatch)
    state = checkpoint.rng_state()
    assert int(state["cuda"][0]) == 3  # this rank's GPU only
    resumed = FakeCuda(0)  # resumed under another visibility: the rank's GPU is now cuda:0
    resumed.install(monkeypatch)
    checkpoint.set_rng_state(state)
    assert resumed.restored == [3]  # its own state, wherever its GPU now is


def test_a_checkpoint_of_every_gpus_state_restores_the_ranks_own_or_refuses(monkeypatch):
    fake = FakeCuda(1)
    fake.install(monkeypatch)
    state = {**checkpoint.rng_state(), "cuda": [torch.tensor([10], dtype=torch.uint8), torch.tensor([11], dtype=torch.uint8)]}
    checkpoint.set_rng_state(state)
    assert fake.restored == [11]
    FakeCuda(5).install(monkeypatch)
    with pytest.raises(ValueError, match="random states of 2 GPU"):  # before: IndexError
        checkpoint.set_rng_state(state)


def test_two_torchrun_ranks_are_refused_one_visible_gpu(monkeypatch):
    from taser.runtime import pick_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "abc")
    with pytest.raises(ValueError, match="torchrun started local rank 1 on a machine that shows 1 GPU"):
        pick_device("auto")
    monkeypatch.delenv("TORCHELASTIC_RUN_ID")  # SLURM gave each task a GPU of its own: it takes it
    assert pick_device("auto") == torch.device("cuda", 0)


def test_a_table_job_of_several_slurm_tasks_is_refused_before_any_stage(monkeypatch):
    """Item 1: with submitit's tasks_per_node > 1 every task ran the whole row and the one holding the
    training lock waited in init_process_group for tasks waiting on that lock."""
    from taser.pipeline.rows import SeveralTasks, refuse_several_tasks, run_row

    with pytest.raises(SeveralTasks, match="tasks_per_node=1"):
        refuse_several_tasks({"SLURM_STEP_NUM_TASKS": "2", "SLURM_PROCID": "1"})
    refuse_several_tasks({"SLURM_STEP_NUM_TASKS": "1"})  # one task: fine
    refuse_several_tasks({"SLURM_STEP_NUM_TASKS": "8", "TORCHELASTIC_RUN_ID": "x"})  # torchrun's ranks are not tasks
    refuse_several_tasks({"SLURM_NTASKS": "8"})  # a batch script's own process (no step): one process

    class Job:  # run_row must refuse before it reads anything of the job
        table = property(lambda self: pytest.fail("the row started"))

    monkeypatch.setenv("SLURM_STEP_NUM_TASKS", "2")
    with pytest.raises(SeveralTasks):
        run_row(Job())


def test_a_process_started_in_an_interactive_srun_pty_shell_runs_alone(monkeypatch):
    """`srun -n 8 --pty bash`: every command typed in the shell inherits task 0 of 8. encode_passages.py
    encoded 1/8 of the corpus and exited 0, train.py waited 30 min for 7 ranks, experiment.py was refused."""
    import os
    import time

    from taser.pipeline import encode
    from taser.pipeline.rows import refuse_several_tasks
    from taser.training import distributed

    shell = {"SLURM_JOB_ID": "991", "SLURM_JOB_NAME": "bash", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "8",
             "SLURM_STEP_TASKS_PER_NODE": "8", "SLURM_STEP_NODELIST": "127.0.0.1", "SLURM_PROCID": "0", "SLURM_LOCALID": "0",
             "SLURM_NTASKS": "8", "SLURM_PTY_PORT": "40123"}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "RANK", "WORLD_SIZE", "LOCAL_", "MASTER_", "TORCHELASTIC"))}
    monkeypatch.setattr(os, "environ", {**env, **shell})
    assert distributed.slurm_step_tasks() == 1
    assert encode.launcher_shard() == (0, 1)
    refuse_several_tasks()
    start = time.perf_counter()
    info = distributed.init_distributed(device="cpu", timeout_s=5)
    assert info.world_size == 1 and time.perf_counter() - start < 5
    distributed.destroy_distributed()
    monkeypatch.setattr(os, "environ", {**env, **{k: v for k, v in shell.items() if k != "SLURM_PTY_PORT"}})
    assert distributed.slurm_step_tasks() == 8 and encode.launcher_shard() == (0, 8)  # `srun -n 8` without --pty: 8 tasks


def test_srun_tasks_encode_one_shard_each_on_their_own_gpu(monkeypatch):
    """Item 4: `srun -n 8 scripts/encode_passages.py` encoded the whole corpus 8 times on GPU 0."""
    import os

    from taser.pipeline import encode

    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update(SLURM_STEP_NUM_TASKS="8", SLURM_PROCID="5", SLURM_LOCALID="1", SLURM_JOB_ID="42", SLURM_STEP_NODELIST="gpu[01-04]")
    monkeypatch.setattr(os, "environ", env)
    assert encode.launcher_shard() == (5, 8)
    assert env["LOCAL_RANK"] == "1"  # pick_device then takes cuda:1 on a node that shows several GPUs
    monkeypatch.setattr(os, "environ", {k: v for k, v in env.items() if not k.startswith(("SLURM", "RANK", "WORLD", "LOCAL"))})
    assert encode.launcher_shard() == (0, 1)


def test_ranks_that_see_different_checkpoints_refuse_to_resume(tmp_path, tiny_pretrained, mini_squad, monkeypatch):
    """Item 6: each rank decided alone whether to resume, so ranks reading node-local directories
    (one with the checkpoint, one without) trained from different steps and hung at the end. The
    ranks now compare what they see (a collective) and all refuse; here rank 1's view is simulated."""
    from conftest import tiny_model_cfg

    import taser.training.checkpoint as trainer
    from taser.pipeline.train import run_training

    train = dict(batch_size=4, hard_negatives=1, max_steps=3, save_every=1, warmup_steps=1, val_max_questions=0, progress=False,
                 precision="fp32", device="cpu")
    model, files = tiny_model_cfg(tiny_pretrained), [str(mini_squad / "train.json")]

    def crash(step, record):
        if step == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_training(model, files, train, tmp_path / "run", on_step=crash)
    views = []
    monkeypatch.setattr(trainer, "all_ranks", lambda view: views.append(view) or [view, None])  # rank 1 sees no checkpoint
    with pytest.raises(RuntimeError, match="the ranks see different checkpoints"):
        run_training(model, files, {**train, "resume": True}, tmp_path / "run")
    assert views and views[0] is not None
    monkeypatch.setattr(trainer, "all_ranks", lambda view: [view, view])  # both see the same file: resumed
    assert run_training(model, files, {**train, "resume": True}, tmp_path / "run").steps == 3


def test_a_rows_allocation_record_names_its_slurm_job_or_none(monkeypatch):
    from taser.pipeline import allocation as module

    assert module.allocation({})["scheduler"] is None
    monkeypatch.setattr(module, "_queue_times", lambda job: {"job": job, "waited_s": 3.0})
    record = module.allocation({"SLURM_JOB_ID": "12", "SLURM_ARRAY_JOB_ID": "7", "SLURM_ARRAY_TASK_ID": "3", "SLURM_CPUS_PER_TASK": "4"})
    assert record["scheduler"] == "slurm" and record["job_id"] == "12" and record["cpus_per_task"] == "4"
    assert record["array_task"] == "7_3" and record["job"] == "7_3" and record["waited_s"] == 3.0  # squeue knows an array's task as A_T


@pytest.mark.slow
def test_a_hybrid_on_a_smaller_allocation_finds_the_model_its_row_trained_on_the_documented_one(squad4, tiny_pretrained, tmp_path, monkeypatch):  # noqa: F811
    """Item 12: dpr trained on the table's 2 processes; the hybrid's job, on one (an evaluate-class
    allocation), used to key dpr's training by its own allocation and train it again."""
    from test_experiment import job_of, tiny

    import taser.pipeline.rows as rows
    import taser.pipeline.train as train_module
    from taser.pipeline.stages import StageStore

    def fake_torchrun(model, files, train, out, processes):
        (out / "final").mkdir(parents=True)

    monkeypatch.setattr(rows, "train_under_torchrun", fake_torchrun)
    base = [*tiny(squad4, tiny_pretrained, tmp_path / "stages"), "table.processes=2"]
    store = StageStore(tmp_path / "stages")
    dpr = rows.RowRun(job_of([*base, "row=dpr", "processes=2"]), store)
    trained = dpr.trained(dpr.table.rows["dpr"], 1)
    assert trained.built
    monkeypatch.setattr(train_module, "run_training", lambda *a, **k: pytest.fail("dpr trained again, on one process"))
    hybrid = rows.RowRun(job_of([*base, "row=hybrid"]), store)  # processes: null, one on this CPU
    found = hybrid.trained(hybrid.table.rows["dpr"], 1)
    assert found.key == trained.key and not found.built
    own = rows.RowRun(job_of([*base, "row=dpr"]), store)  # dpr's own job on one process: its own recipe (a global batch of 2), warned
    with pytest.raises(pytest.fail.Exception, match="trained again"):
        own.trained(own.table.rows["dpr"], 1)


@pytest.mark.slow
def test_a_trained_rows_index_is_encoded_by_every_process_of_its_job(tiny_pretrained, tmp_path, capfd):
    """Item 3: a job with 2 processes (2 GPUs) encoded 21M passages on one of them while the other
    idled; now its dense-index stage runs torchrun with one shard per rank. The index equals the
    one-process index (same passages, same vectors), and a leftover of another shard count is
    not mixed in."""
    import numpy as np

    from taser.pipeline.evaluate import dense_index
    from taser.pipeline.experiment import save_initial
    from taser.retrieval.faiss_index import load_index

    checkpoint = save_initial({"pretrained": tiny_pretrained, "model_type": "shared", "max_length": 64}, tmp_path / "ckpt")
    passages = tmp_path / "passages.tsv"
    lines = ["id\ttext\ttitle"] + [f"{i}\tpassage number {i} about topic {i % 7}\tTitle {i % 5}" for i in range(1, 42)]
    passages.write_text("\n".join(lines) + "\n")
    one = dense_index(checkpoint, passages, tmp_path / "one", 8, "fp32", "cpu", chunk_size=10)
    (tmp_path / "two" / "embeddings" / "shard_000_of_003").mkdir(parents=True)  # a killed run's scratch with another shard count
    capfd.readouterr()
    two = dense_index(checkpoint, passages, tmp_path / "two", 8, "fp32", "cpu", chunk_size=10, shards=2)
    ranks = capfd.readouterr().err
    assert "shard 0 of 2: 20 passages encoded now" in ranks and "shard 1 of 2: 21 passages encoded now" in ranks  # two ranks, a half each
    a, b = load_index(one), load_index(two)
    assert a.index.ntotal == b.index.ntotal == 41 and a.ids == b.ids
    np.testing.assert_allclose(a.index.reconstruct_n(0, 41), b.index.reconstruct_n(0, 41), atol=1e-5)
    assert not (tmp_path / "two" / "embeddings").exists()


def test_the_queue_wait_is_start_minus_submit_as_squeue_reports_them(tmp_path, monkeypatch):
    import stat

    from taser.pipeline import allocation as module

    squeue = tmp_path / "squeue"
    squeue.write_text("#!/bin/sh\necho '2026-12-03T10:00:00|2026-12-03T10:01:30'\n")
    squeue.chmod(squeue.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    assert module._queue_times("42") == {"submitted": "2026-12-03T10:00:00", "started": "2026-12-03T10:01:30", "waited_s": 90.0}
    squeue.write_text("#!/bin/sh\necho 'N/A|N/A'\n")
    assert module._queue_times("42") == {}  # a job squeue cannot date: no figure rather than a wrong one
