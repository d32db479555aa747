"""What a GPU run needs, checked on a CPU: no host read inside a training step, batches built by
loader workers in the same order after a resume, host-side facts exchanged through a group that
takes CPU tensors (NCCL does not), DDP's unused-parameter search only where a parameter can sit
out, and an fp16 overflow that skips its step instead of stopping the run."""

import logging
import math

import pytest
import torch
import torch.multiprocessing as mp
from conftest import tiny_model_cfg
from host_reads import CountHostReads, NoHostReads

from taser.data.biencoder_json import BiEncoderJsonFile
from taser.models.loading import load_model
from taser.training.config import TrainConfig
from taser.training.loader import StepBatches, default_loader_workers, step_loader
from taser.training.records import PendingStep, read_steps
from taser.training.sampler import MultiSetSchedule
from taser.training.trainer import Trainer

TRAIN = dict(batch_size=2, hard_negatives=1, other_negatives=1, max_steps=4, log_every=2, save_every=0, val_max_questions=0, progress=False,
             precision="fp32", device="cpu", warmup_steps=0, learning_rate=1e-3)

def _trainer(pretrained, tokenizer, data_dir, tmp_path, model_type="dpr", model_extra=None, **train):
    model, _ = load_model(tiny_model_cfg(pretrained, model_type, **(model_extra or {})))
    cfg = TrainConfig.from_value({**TRAIN, **train})
    return Trainer(model, tokenizer, [BiEncoderJsonFile(data_dir / "train.json")], cfg, tmp_path)


@pytest.mark.parametrize("model_type, model_extra, train", [
    ("dpr", {}, {}),
    ("shared", {}, {"grad_cache_chunk": 3, "grad_accumulation": 2}),
    ("taser", {"taser": {"specialize_every": 1}}, {}),
])
def test_a_training_step_reads_nothing_back_from_the_device(tiny_pretrained, tokenizer, mini_squad, tmp_path, model_type, model_extra, train):
    """Would catch a host sync per micro-step (`float(loss)`, `int(mask.sum().max())`, routers'
    `float()`, a per-step `float(grad_norm)`), each of which empties a GPU's queue of work."""
    # as on a GPU: the padded path (padding-free is a CPU default; its layout is built on the host)
    trainer = _trainer(tiny_pretrained, tokenizer, mini_squad, tmp_path, model_type, {**model_extra, "unpad": False}, **train)
    loop = trainer._set_up()
    batches = iter(trainer._loader(0))
    for step in range(2):
        micro_batches = next(batches)
        with NoHostReads():
            loop.pending.append(trainer._optimizer_step(loop, step, micro_batches))
    records = read_steps(loop.pending, 2 * trainer.cfg.grad_accumulation, skips_overflow=False)  # the one read, per log line
    assert [r["step"] for r in records] == [1, 2] and all(math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) for r in records)


def test_the_guard_sees_a_host_read(tiny_pretrained, tokenizer, mini_squad, tmp_path, monkeypatch):
    """The guard above is live: a per-step `float()` of the gradient norm trips it."""
    import taser.training.trainer as trainer_module

    trainer = _trainer(tiny_pretrained, tokenizer, mini_squad, tmp_path, "dpr", {"unpad": False})
    loop = trainer._set_up()
    real = trainer_module.clip_gradients
    monkeypatch.setattr(trainer_module, "clip_gradients", lambda *a, **k: (lambda n: (float(n.total), n)[1])(real(*a, **k)))
    micro_batches = next(iter(trainer._loader(0)))
    with NoHostReads(), pytest.raises(AssertionError, match="host read inside a training step: __float__"):
        trainer._optimizer_step(loop, 0, micro_batches)


_x = torch.tensor([0.5, -1.0, 2.0])
_idx = torch.tensor([0, 2, 2])
GUARDED = {  # every op the guard lists, each in a form that reads the device
    "item": lambda: _x[0].item(), "tolist": lambda: _x.tolist(), "float": lambda: float(_x[0]), "int": lambda: int(_idx[0]),
    "bool": lambda: bool(_x[0] > 0), "index": lambda: [1, 2][_idx[0]], "cpu": lambda: _x.cpu(), "numpy": lambda: _x.numpy(),
    "nonzero": lambda: _x.nonzero(), "torch.nonzero": lambda: torch.nonzero(_x), "masked_select": lambda: _x.masked_select(_x > 0),
    "torch.masked_select": lambda: torch.masked_select(_x, _x > 0), "unique": lambda: torch.unique(_idx), "Tensor.unique": lambda: _idx.unique(),
    "unique_consecutive": lambda: torch.unique_consecutive(_idx), "Tensor.unique_consecutive": lambda: _idx.unique_consecutive(),
    "bincount": lambda: torch.bincount(_idx, minlength=3), "Tensor.bincount": lambda: _idx.bincount(), "argwhere": lambda: torch.argwhere(_x),
    "Tensor.argwhere": lambda: _x.argwhere(), "histc": lambda: torch.histc(_x), "Tensor.histc": lambda: _x.histc(),
    "boolean mask": lambda: _x[_x > 0], "boolean mask in a tuple": lambda: _x.view(1, 3)[0, _x > 0],
    "boolean mask assignment": lambda: _x.clone().__setitem__(_x > 0, 0.0),
    "index_put_ with a mask": lambda: _x.clone().index_put_((_x > 0,), torch.tensor(0.0)),
    "repeat_interleave": lambda: torch.repeat_interleave(_x, _idx + 1), "Tensor.repeat_interleave": lambda: _x.repeat_interleave(_idx + 1),
    "repeat_interleave(repeats)": lambda: torch.repeat_interleave(_idx), "where(condition)": lambda: torch.where(_x > 0),
}


@pytest.mark.parametrize("op", sorted(GUARDED))
def test_the_widened_guard_trips_on_each_op_it_lists(op):
    """Would catch an op of the list the guard no longer sees (the ops learned routing uses were unseen before)."""
    with NoHostReads(), pytest.raises(AssertionError, match="host read inside a training step"):
        GUARDED[op]()
    with NoHostReads():  # the same ops without a read pass
        _x[1:], _x.repeat_interleave(2), torch.repeat_interleave(_x, _idx + 1, output_size=7), _x[_idx], torch.where(_x > 0, _x, 0.0)


def test_learned_routing_reads_the_host_only_in_its_routed_layers(tiny_pretrained, tokenizer, mini_squad, tmp_path):
    """Learned routing reads each expert's count of units once per routed layer (by design); the
    guard allows exactly those reads (`host_reads.ROUTED`) and still trips on any other."""
    for routing in ("learned_token", "learned_sequence"):
        trainer = _trainer(tiny_pretrained, tokenizer, mini_squad, tmp_path / routing, "taser",
                           {"unpad": False, "taser": {"specialize_every": 1, "routing": routing}})
        loop = trainer._set_up()
        batches = iter(trainer._loader(0))
        first, second = next(batches), next(batches)
        guard = NoHostReads(allow_routed=True)
        with guard:
            loop.pending.append(trainer._optimizer_step(loop, 0, first))
        assert guard.routed_reads and {f for _, f in guard.routed_reads} <= {"dispatch", "load_balance_loss", "run_tokens", "record"}
        with NoHostReads(), pytest.raises(AssertionError):  # without the allow-list the same step trips the guard
            trainer._optimizer_step(loop, 1, second)


def _ids(loader):
    return [[(b.questions["input_ids"], b.passages["input_ids"], b.question_lengths) for b in step] for step in loader]


def test_loader_workers_give_the_same_batches_in_order_before_and_after_a_resume(tokenizer, mini_squad):
    """Would catch workers handing out steps out of order, or a resumed loader starting at step 0
    or drawing other negatives."""
    data = [BiEncoderJsonFile(mini_squad / "train.json")]
    schedule = MultiSetSchedule([len(data[0])], 4, seed=5)
    common = dict(seed=5, batch_size=2, grad_accumulation=2, hard_negatives=1, other_negatives=1, max_question_length=32, max_length=48,
                  rank=1, world_size=1, total_steps=schedule.batches_per_epoch + 2)  # into a second epoch

    def steps(first_step, workers):
        return _ids(step_loader(StepBatches(data, schedule, tokenizer, first_step=first_step, **common), workers, pin_memory=False))

    inline = steps(0, 0)
    assert len(inline) == common["total_steps"] and len(inline[0]) == 2
    for a, b in zip(steps(0, 2), inline, strict=True):
        for (qa, pa, la), (qb, pb, lb) in zip(a, b, strict=True):
            assert torch.equal(qa, qb) and torch.equal(pa, pb) and la == lb
    resumed = steps(3, 2)
    assert len(resumed) == len(inline) - 3
    for a, b in zip(resumed, inline[3:], strict=True):
        assert all(torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]) for x, y in zip(a, b))
    assert not torch.equal(inline[0][0][1], inline[1][0][1])  # steps differ: the comparison can fail


def test_training_with_loader_workers_equals_training_without(tiny_pretrained, mini_squad, tmp_path):
    """Would catch batches built by workers differing from the inline ones."""
    from safetensors.torch import load_file

    from taser.pipeline.train import run_training

    model = tiny_model_cfg(tiny_pretrained, "dpr")
    for workers in (0, 2):
        run_training(model, [str(mini_squad / "train.json")], {**TRAIN, "max_steps": 2, "loader_workers": workers}, tmp_path / str(workers))
    a, b = (load_file(str(tmp_path / w / "final" / "model.safetensors")) for w in ("0", "2"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_loader_workers_follow_the_device(monkeypatch):
    assert default_loader_workers(torch.device("cpu")) == 0
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(16)))
    assert default_loader_workers(torch.device("cuda", 0), local_world_size=8) == 1
    assert default_loader_workers(torch.device("cuda", 0), local_world_size=1) == 4
    with pytest.raises(ValueError, match="train.loader_workers must be an integer >= 0"):
        TrainConfig(loader_workers=-1)


def _cuda_only_worker(rank, world, init_file, out):
    """Rank `rank` in a group whose default backend takes CUDA tensors only, as NCCL does."""
    import os

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), TASER_DIST_INIT=f"file://{init_file}")
    import torch.distributed as dist

    from taser.training.distributed import all_reduce_sum, destroy_distributed, gather_sizes, init_distributed

    init_distributed("cuda:gloo")
    sizes = gather_sizes(3 + rank)  # host-side facts go through the CPU group beside it
    try:
        all_reduce_sum(torch.ones(2))  # a CPU tensor on the default group: what NCCL refuses
        refused = None
    except RuntimeError as e:
        refused = str(e)
    dist.barrier(group=__import__("taser.training.distributed", fromlist=["host_group"]).host_group())
    destroy_distributed()
    if rank == 0:
        torch.save({"sizes": sizes, "refused": refused}, out)


@pytest.mark.slow
def test_host_facts_travel_beside_a_device_only_group(tmp_path):
    """Would catch a row-count exchange sent through the default group with CPU tensors, which
    stops an NCCL run at its first step ("No backend type associated with device type cpu")."""
    mp.spawn(_cuda_only_worker, args=(2, tmp_path / "dist-init", tmp_path / "out.pt"), nprocs=2, join=True)
    result = torch.load(tmp_path / "out.pt")
    assert result["sizes"] == [3, 4]
    assert result["refused"] is not None and "device type cpu" in result["refused"]  # the group really refuses CPU tensors


@pytest.mark.parametrize("model_type, extra, train, idle", [
    ("dpr", {}, {}, False),
    ("shared", {}, {}, False),
    ("taser", {"taser": {"specialize_every": 1}}, {}, False),  # both experts run in every step's forward
    ("taser", {"taser": {"specialize_every": 1, "routing": "learned_token"}}, {}, True),  # an expert may get no token
    ("dpr", {}, {"grad_cache_chunk": 2}, True),  # a chunk runs one encoder only
])
def test_ddp_searches_for_unused_parameters_only_where_one_can_sit_out(tiny_pretrained, tokenizer, mini_squad, tmp_path, model_type, extra, train,
                                                                       idle):
    """Would catch find_unused_parameters=True always (a graph walk every step) or never (DDP
    then fails when an expert gets no input); the pooler, used by no vector, is not trained."""
    trainer = _trainer(tiny_pretrained, tokenizer, mini_squad, tmp_path, model_type, extra, **train)
    assert trainer._may_leave_parameters_idle() is idle
    poolers = [m.pooler for m in (trainer.model.question_encoder, trainer.model.passage_encoder) if m is not None]
    assert poolers and all(not p.requires_grad for pooler in poolers for p in pooler.parameters())


def test_an_fp16_overflow_skips_its_step(tiny_pretrained, tokenizer, mini_squad, tmp_path, caplog):
    """Would catch an overflow that stops the run (FloatingPointError) instead of letting the
    gradient scaler skip the update and lower its scale, as fp16 training expects."""
    trainer = _trainer(tiny_pretrained, tokenizer, mini_squad, tmp_path, "dpr", {"unpad": False})
    loop = trainer._set_up()
    loop.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**127)  # scaled gradients overflow float32
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    pending = trainer._optimizer_step(loop, 0, next(iter(trainer._loader(0))))
    assert all(torch.equal(v, before[k]) for k, v in trainer.model.state_dict().items())  # the update was skipped
    assert loop.scaler.get_scale() < 2.0**127
    with caplog.at_level(logging.WARNING, logger="taser.training.records"):
        (record,) = read_steps([pending], 2, skips_overflow=True)
    assert record["skipped"] and "fp16 overflow" in caplog.text
    nan = PendingStep({"step": 7}, torch.tensor(float("nan")), torch.tensor(0.0), None, {})
    with pytest.raises(FloatingPointError, match="loss is nan at step 7"):
        read_steps([nan], 2, skips_overflow=False)


def test_encoding_reads_the_vectors_back_once(tiny_pretrained, tokenizer):
    """Would catch a `.cpu()` per batch, which makes the host wait for the device after every
    batch instead of building the next one while it computes."""
    from taser.models.encoding import encode_ids, encode_texts

    model, _ = load_model(tiny_model_cfg(tiny_pretrained, "shared", unpad=False))
    texts = [f"question number {i} about " + "words " * (i % 7) for i in range(20)]
    ids = tokenizer(texts)["input_ids"]
    counter = CountHostReads()
    with counter:
        vectors = encode_ids(model, tokenizer, ids, "question", batch_size=4, precision="fp32")
    assert counter.reads == ["cpu", "numpy"]  # five batches, one read back at the end
    np_expected = encode_texts(model, tokenizer, texts, "question", batch_size=64, precision="fp32")
    torch.testing.assert_close(torch.from_numpy(vectors), torch.from_numpy(np_expected), rtol=1e-5, atol=1e-6)


def test_encoding_batch_fits_the_device(tiny_pretrained, monkeypatch):
    from taser.models.encoding import CPU_BATCH, auto_batch_size

    model, _ = load_model(tiny_model_cfg(tiny_pretrained, "shared"))
    assert auto_batch_size(model, torch.device("cpu"), 256) == CPU_BATCH
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free[0], 80 * 2**30))
    free = [60 * 2**30]
    big = auto_batch_size(model, torch.device("cuda", 0), 256)
    free[0] = 2**20
    assert big == 1024 and auto_batch_size(model, torch.device("cuda", 0), 256) == 16  # a power of two within bounds
    free[0] = 2**28
    mid = auto_batch_size(model, torch.device("cuda", 0), 256)
    assert 16 <= mid < 1024 and mid & (mid - 1) == 0
