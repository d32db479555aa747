"""Two CPU processes (gloo) must compute what one process computes on the whole batch, and a killed
2-process run must resume where it stopped. The processes meet through a file in the test's
tmp_path (`TASER_DIST_INIT=file://...`): no port to pick and lose to another program."""

import datetime
import json
import os

import pytest
import torch
import torch.multiprocessing as mp
from conftest import tiny_model_cfg
from safetensors.torch import load_file

from taser.data.biencoder_json import BiEncoderJsonFile
from taser.models.loading import load_model
from taser.pipeline.train import run_training
from taser.training.batching import collate, example_rng, make_example
from taser.training.distributed import all_reduce_sum, data_parallel, destroy_distributed, master_port
from taser.training.loss import LossConfig
from taser.training.step import StepRunner

pytestmark = pytest.mark.slow


def taser_model_cfg(pretrained):
    return tiny_model_cfg(pretrained, "taser", dropout=0.0, taser={"specialize_every": 1})


# a large Adam epsilon keeps updates proportional to gradients (see test_training)
# fp32, not `auto`: on a CPU with native bf16, `auto` trains in bf16, whose rounding depends on
# how the batch is split, and these tests compare 2 ranks with 1 process to float32 tolerance
TRAIN = dict(
    precision="fp32",
    device="cpu",
    adam_eps=1e-3,
    hard_negatives=1,
    other_negatives=0,
    learning_rate=1e-3,
    warmup_steps=1,
    max_steps=3,
    log_every=1,
    save_every=0,
    val_max_questions=0,
    progress=False,
    seed=3,
)


def _join(rank, world, init_file):
    """This process as rank `rank` of `world`, meeting the others through `init_file`."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), TASER_DIST_INIT=f"file://{init_file}")
    from taser.training.distributed import init_distributed

    return init_distributed("gloo")


def _examples(data_dir, n):
    data = BiEncoderJsonFile(data_dir / "train.json")
    return [make_example(data[i], 1, 1, example_rng(0, 0, 0, i)) for i in range(n)]


def _step_grads(pretrained, tokenizer, examples, in_batch, grad_cache, offset, global_q):
    torch.manual_seed(0)
    model, _ = load_model(tiny_model_cfg(pretrained, "dpr", dropout=0.0))
    batch = collate(examples, tokenizer, 32, 64)
    world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
    # under torchrun: torch's DDP sums the gradients over the ranks during backward
    runner = StepRunner(
        data_parallel(model, find_unused_parameters=True), LossConfig("dot", 1.0, in_batch), "fp32", torch.device("cpu"), grad_cache, world_size=world
    )
    stats = runner.run(batch, global_q, offset)
    return float(all_reduce_sum(stats.loss_sum)) / global_q, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _worker(rank, world, init_file, pretrained, data_dir, out_dir):
    from taser.models.biencoder import load_tokenizer

    _join(rank, world, init_file)
    tokenizer = load_tokenizer(pretrained)
    examples = _examples(data_dir, 8)[rank * 4 : (rank + 1) * 4]
    results = {}
    for in_batch in (True, False):
        for chunk in (0, 3):
            results[(in_batch, chunk)] = _step_grads(pretrained, tokenizer, examples, in_batch, chunk, rank * 4, 8)
    if rank == 0:
        torch.save(results, out_dir / "ddp_grads.pt")
    run_training(tiny_model_cfg(pretrained, "dpr", dropout=0.0), [str(data_dir / "train.json")], {**TRAIN, "batch_size": 2}, out_dir / "ddp")
    # TASER (experts each side skips) with gradient accumulation (no_sync until the last micro-batch)
    run_training(taser_model_cfg(pretrained), [str(data_dir / "train.json")], {**TRAIN, "batch_size": 1, "grad_accumulation": 2}, out_dir / "ddp-taser")
    destroy_distributed()  # the library's teardown: cached subgroups first, never left to interpreter shutdown


def test_two_processes_match_one(tmp_path, tiny_pretrained, tokenizer, mini_squad):
    """Would catch gradients averaged instead of summed over ranks, or passages not gathered across ranks."""
    mp.spawn(_worker, args=(2, tmp_path / "dist-init", tiny_pretrained, mini_squad, tmp_path), nprocs=2, join=True)
    ddp = torch.load(tmp_path / "ddp_grads.pt")
    examples = _examples(mini_squad, 8)
    for (in_batch, chunk), (loss, grads) in ddp.items():
        single_loss, single = _step_grads(tiny_pretrained, tokenizer, examples, in_batch, chunk, 0, 8)
        assert loss == pytest.approx(single_loss, rel=1e-5), (in_batch, chunk)
        assert grads.keys() == single.keys()
        for k in single:
            torch.testing.assert_close(grads[k], single[k], rtol=1e-4, atol=1e-5, msg=f"{k} in_batch={in_batch} chunk={chunk}")
    # whole training runs: 2 ranks x batch 2 == 1 process x batch 4
    run_training(tiny_model_cfg(tiny_pretrained, "dpr", dropout=0.0), [str(mini_squad / "train.json")], {**TRAIN, "batch_size": 4}, tmp_path / "single")
    run_training(
        taser_model_cfg(tiny_pretrained), [str(mini_squad / "train.json")], {**TRAIN, "batch_size": 2, "grad_accumulation": 2}, tmp_path / "single-taser"
    )
    for ddp_run, single_run in (("ddp", "single"), ("ddp-taser", "single-taser")):
        a, b = load_file(str(tmp_path / ddp_run / "final" / "model.safetensors")), load_file(str(tmp_path / single_run / "final" / "model.safetensors"))
        assert a.keys() == b.keys()
        for k in a:
            torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5, msg=f"{ddp_run}: {k}")


# dropout on (the tiny BERT's 0.1) and each rank seeded apart: a resume must restore every rank's
# own random state, not rank 0's on both
RESUME = {**TRAIN, "batch_size": 2, "max_steps": 4, "save_every": 2}


def _resume_worker(rank, world, init_file, pretrained, data_dir, out_dir):
    _join(rank, world, init_file)
    model_cfg, train = tiny_model_cfg(pretrained, "shared"), [str(data_dir / "train.json")]
    straight = run_training(model_cfg, train, RESUME, out_dir / "straight")

    def crash(step, record):
        if step == 3:  # after the checkpoint of step 2, on every rank
            raise KeyboardInterrupt

    try:
        run_training(model_cfg, train, RESUME, out_dir / "killed", on_step=crash)
        raise AssertionError("the run was not stopped")
    except KeyboardInterrupt:
        pass
    steps = []
    resumed = run_training(model_cfg, train, {**RESUME, "resume": True}, out_dir / "killed", on_step=lambda step, record: steps.append(step))
    # a 1-process checkpoint resumed by 2 processes
    try:
        run_training(model_cfg, train, {**RESUME, "resume": True}, out_dir / "one-process")
        refusal = None
    except ValueError as e:
        refusal = str(e)
    histories = {"straight": straight.history, "resumed": resumed.history, "steps": steps, "refusal": refusal}
    (out_dir / f"histories-{rank}.json").write_text(json.dumps(histories))
    destroy_distributed()  # the library's teardown: cached subgroups first, never left to interpreter shutdown


def test_two_process_run_resumes_where_it_stopped(tmp_path, tiny_pretrained, mini_squad):
    """Would catch a DDP resume that starts over, restores one rank's random state on every rank,
    or accepts a checkpoint of another number of processes."""
    model_cfg, train = tiny_model_cfg(tiny_pretrained, "shared"), [str(mini_squad / "train.json")]
    run_training(model_cfg, train, {**RESUME, "max_steps": 1}, tmp_path / "one-process")
    mp.spawn(_resume_worker, args=(2, tmp_path / "dist-init", tiny_pretrained, mini_squad, tmp_path), nprocs=2, join=True)
    for rank in range(2):
        h = json.loads((tmp_path / f"histories-{rank}.json").read_text())
        assert h["steps"] == [3, 4], rank  # resumed after step 2, did not redo steps 1-2
        assert [r["step"] for r in h["resumed"]] == [3, 4]
        for mine, theirs in zip(h["resumed"], h["straight"][2:]):
            assert mine["loss"] == theirs["loss"] and mine["grad_norm"] == theirs["grad_norm"] and mine["lr"] == theirs["lr"], (rank, mine["step"])
        assert h["refusal"] is not None and "saved by 1 processes and this run has 2; resume with the same number" in h["refusal"], h["refusal"]
    log = [json.loads(line) for line in (tmp_path / "killed" / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2, 3, 4]
    a, b = load_file(str(tmp_path / "straight" / "final" / "model.safetensors")), load_file(str(tmp_path / "killed" / "final" / "model.safetensors"))
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0, msg=k)
    # a 2-process checkpoint resumed by 1 process is refused, and says why
    with pytest.raises(ValueError, match=r"saved by 2 processes and this run has 1; resume with the same number \(2\)"):
        run_training(model_cfg, train, {**RESUME, "resume": True}, tmp_path / "killed")


def test_init_method_from_the_environment_or_torchrun(monkeypatch):
    """Would catch TASER_DIST_INIT ignored (tests back on a racy port), or torchrun's env:// rendezvous replaced."""
    import taser.training.distributed as distributed

    calls = []
    monkeypatch.setattr(distributed.dist, "is_initialized", lambda: False)
    monkeypatch.setattr(distributed.dist, "init_process_group", lambda *args, **kwargs: calls.append((args, kwargs)))
    monkeypatch.setattr(distributed.dist, "get_rank", lambda: 1)
    monkeypatch.setattr(distributed.dist, "get_world_size", lambda: 2)
    monkeypatch.setattr(distributed.torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.delenv("TASER_DIST_INIT", raising=False)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert distributed.init_distributed("gloo") == distributed.DistInfo(1, 2, 0)
    monkeypatch.setenv("TASER_DIST_INIT", "file:///tmp/somewhere")
    distributed.init_distributed("gloo")
    distributed.init_distributed("gloo", init_method="file:///tmp/elsewhere")
    timeout = {"timeout": datetime.timedelta(seconds=distributed.DEFAULT_TIMEOUT_S)}
    assert calls == [
        (("gloo",), timeout),  # torchrun: MASTER_ADDR/MASTER_PORT from the environment
        (("gloo",), {"init_method": "file:///tmp/somewhere", "rank": 1, "world_size": 2, **timeout}),
        (("gloo",), {"init_method": "file:///tmp/elsewhere", "rank": 1, "world_size": 2, **timeout}),
    ]


def test_the_process_group_follows_the_training_device(monkeypatch):
    """Would catch NCCL chosen whenever CUDA is visible (`train.device=cpu` on a GPU host then
    builds DDP over CPU tensors on NCCL, which refuses them), or a GPU run without a backend for
    the host's row counts."""
    import taser.training.distributed as distributed

    calls, devices = [], []
    monkeypatch.setattr(distributed.dist, "is_initialized", lambda: False)
    monkeypatch.setattr(distributed.dist, "init_process_group", lambda backend, **kwargs: calls.append(backend))
    monkeypatch.setattr(distributed.dist, "get_rank", lambda: 1)
    monkeypatch.setattr(distributed.dist, "get_world_size", lambda: 2)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", devices.append)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.delenv("TASER_DIST_INIT", raising=False)
    distributed.init_distributed(device="cpu")
    distributed.init_distributed(device="auto")
    distributed.init_distributed(device="cuda")
    assert calls == ["gloo", "cpu:gloo,cuda:nccl", "cpu:gloo,cuda:nccl"]
    assert devices == [torch.device("cuda", 1)] * 2  # the CPU run leaves the GPUs alone


def _cpu_run_on_a_gpu_host(rank, world, init_file, out):
    """A rank of `torchrun ... train.device=cpu` on a host where CUDA is visible."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), TASER_DIST_INIT=f"file://{init_file}")
    torch.cuda.is_available = lambda: True  # as on a GPU host; this CPU build has no NCCL, so choosing it fails here
    from taser.training.distributed import all_reduce_sum, destroy_distributed, gather_sizes, init_distributed

    init_distributed(device="cpu")
    summed = all_reduce_sum(torch.tensor([1.0 + rank]))  # CPU tensors on the default group: what DDP on the CPU sends
    sizes = gather_sizes(2 + rank)
    destroy_distributed()
    if rank == 0:
        torch.save({"summed": summed, "sizes": sizes}, out)


def test_a_cpu_run_on_a_gpu_host_gets_a_group_that_takes_cpu_tensors(tmp_path):
    mp.spawn(_cpu_run_on_a_gpu_host, args=(2, tmp_path / "dist-init", tmp_path / "out.pt"), nprocs=2, join=True)
    result = torch.load(tmp_path / "out.pt")
    assert result["summed"].tolist() == [3.0] and result["sizes"] == [2, 3]


def test_a_group_with_a_gloo_backend_for_the_cpu_takes_cpu_tensors(monkeypatch):
    """Would catch a `cpu:gloo,cuda:nccl` default group (every GPU run's) not seen as taking CPU
    tensors: each run would then build a second gloo group for the host's facts, a collective it
    does not need; NCCL alone does not take them."""
    from torch.distributed.distributed_c10d import Backend, BackendConfig

    import taser.training.distributed as distributed

    def new_group(**kwargs):
        raise AssertionError(f"a second group was built: {kwargs}")

    monkeypatch.setattr(distributed, "_HOST_GROUPS", {})
    monkeypatch.setattr(distributed.dist, "new_group", new_group)
    for backend, takes in (("gloo", True), (distributed.GPU_BACKEND, True), ("nccl", False)):
        config = BackendConfig(Backend(backend))  # as torch describes the default group made with `backend`
        monkeypatch.setattr(distributed.dist, "get_backend_config", lambda group=None, c=config: str(c))
        assert distributed._takes_cpu_tensors() is takes, (backend, str(config))
        if takes:
            assert distributed.host_group() is distributed.dist.group.WORLD
        else:
            with pytest.raises(AssertionError, match="a second group was built: {'backend': 'gloo'}"):
                distributed.host_group()


def test_srun_tasks_join_as_torchruns_would(monkeypatch):
    """Would catch a SLURM job's tasks (srun, submitit; one GPU per task) not forming one group:
    rank, world size, local rank and the master's address come from SLURM's environment."""
    import taser.training.distributed as distributed

    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TASER_DIST_INIT", "LOCAL_WORLD_SIZE"):
        monkeypatch.setenv(key, "unset")  # recorded, so that what init_distributed writes is undone after the test
        monkeypatch.delenv(key)
    slurm = {"SLURM_PROCID": "5", "SLURM_STEP_NUM_TASKS": "8", "SLURM_LOCALID": "1", "SLURM_STEP_NODELIST": "gpu[07-08,11]",
             "SLURM_STEP_TASKS_PER_NODE": "4(x2)", "SLURM_JOB_ID": "123456"}
    for key, value in slurm.items():
        monkeypatch.setenv(key, value)
    calls, devices = [], []
    monkeypatch.setattr(distributed.dist, "is_initialized", lambda: False)
    monkeypatch.setattr(distributed.dist, "init_process_group", lambda backend, **kwargs: calls.append((backend, dict(os.environ))))
    monkeypatch.setattr(distributed.dist, "get_rank", lambda: int(os.environ["RANK"]))
    monkeypatch.setattr(distributed.dist, "get_world_size", lambda: int(os.environ["WORLD_SIZE"]))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)  # --gpus-per-task=1: each task sees its own GPU only
    monkeypatch.setattr(torch.cuda, "set_device", devices.append)
    info = distributed.init_distributed()
    assert info == distributed.DistInfo(5, 8, 1)
    (backend, env), = calls
    assert backend == "cpu:gloo,cuda:nccl" and (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"]) == ("5", "8", "1")
    assert (env["MASTER_ADDR"], env["MASTER_PORT"], env["LOCAL_WORLD_SIZE"]) == ("gpu07", str(master_port(123456)), "4")
    assert devices == [torch.device("cuda", 0)]  # its one visible GPU, though LOCAL_RANK is 1


def test_a_batch_scripts_own_process_does_not_wait_for_others():
    from taser.training.distributed import first_host, slurm_environment

    assert slurm_environment({"SLURM_PROCID": "0", "SLURM_NTASKS": "8", "SLURM_JOB_NODELIST": "n1"}) == {}  # not a srun step
    assert slurm_environment({"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "1"}) == {}
    assert slurm_environment({"SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "2", "WORLD_SIZE": "2"}) == {}  # torchrun's own variables win
    assert [first_host(n) for n in ("node1", "a[3-5],b1", "gpu[009,011-012]", "x1,y[1-2]", "node[1-4]-ib", "rack[1-2]-node[01-04]")] == [
        "node1", "a3", "gpu009", "x1", "node1-ib", "rack1-node01"]


def _slow_preparation_worker(rank, world, init_file, out):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), TASER_DIST_INIT=f"file://{init_file}")
    import time

    from taser.pipeline.training_data import local_main_first
    from taser.training.distributed import destroy_distributed, init_distributed

    info = init_distributed("gloo", timeout_s=2)  # the default group gives up after 2 s here (30 minutes in a run)

    def make():
        if info.local_rank == 0:
            time.sleep(6)  # a hub dataset prepared for longer than the default group's timeout
            (out / "prepared").write_text("made")
        return (out / "prepared").read_text()

    (out / f"rank-{rank}").write_text(local_main_first(info, make))
    destroy_distributed()


@pytest.mark.rehearsal
@pytest.mark.slow
def test_ranks_wait_for_a_preparation_longer_than_the_collective_timeout(tmp_path):
    """Item 9 of issue 44: local rank 0 preparing a hub dataset for more than 30 minutes timed the
    other ranks out (they waited in the default group's collective)."""
    mp.spawn(_slow_preparation_worker, args=(2, tmp_path / "dist-init", tmp_path), nprocs=2, join=True)
    assert (tmp_path / "rank-0").read_text() == (tmp_path / "rank-1").read_text() == "made"


def _node_local_worker(rank, world, init_file, pretrained, data_dir, out_dir):
    _join(rank, world, init_file)
    model_cfg, train = tiny_model_cfg(pretrained, "shared"), [str(data_dir / "train.json")]
    mine = out_dir / f"node-{rank}"  # an output directory on each node's local disk: rank 0 writes the checkpoints in its own

    def crash(step, record):
        if step == 3:
            raise KeyboardInterrupt

    try:
        run_training(model_cfg, train, RESUME, mine, on_step=crash)
    except KeyboardInterrupt:
        pass
    try:
        run_training(model_cfg, train, {**RESUME, "resume": True}, mine)
        outcome = "resumed"
    except RuntimeError as e:
        outcome = str(e)
    (out_dir / f"outcome-{rank}.txt").write_text(outcome)
    destroy_distributed()  # the library's teardown: cached subgroups first, never left to interpreter shutdown


@pytest.mark.slow
def test_ranks_that_see_different_checkpoints_in_node_local_directories_all_refuse(tmp_path, tiny_pretrained, mini_squad):
    """Item 6 of issue 44 with two real processes: rank 0 finds its checkpoint, rank 1 (another
    node's disk) none; each used to decide alone (rank 0 resumed at step 3, rank 1 started over, and
    both hung at the end). Both now refuse, saying why."""
    mp.spawn(_node_local_worker, args=(2, tmp_path / "dist-init", tiny_pretrained, mini_squad, tmp_path), nprocs=2, join=True)
    for rank in range(2):
        assert "the ranks see different checkpoints" in (tmp_path / f"outcome-{rank}.txt").read_text(), rank
