"""Issue 44's smaller items that one CPU can show: a rank's CUDA random state saved and restored as
its own GPU's (item 5), rendezvous ports outside Linux's ephemeral range (item 9), two torchrun
ranks refused one visible GPU (item 9), and a job of several SLURM tasks refused before any stage
starts (item 1)."""

import pytest
import torch

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

    import taser.training.trainer as trainer
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
