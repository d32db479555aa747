"""Two CPU processes (gloo) must compute what one process computes on the whole batch."""

import os
import socket

import pytest
import torch
import torch.multiprocessing as mp
from conftest import tiny_model_cfg
from safetensors.torch import load_file

from taser.data.biencoder_json import BiEncoderJsonFile
from taser.models.loading import load_model
from taser.pipeline.train import run_training
from taser.training.batching import collate, example_rng, make_example
from taser.training.distributed import all_reduce_sum, data_parallel
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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
    return all_reduce_sum(stats.loss_sum) / global_q, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _worker(rank, world, port, pretrained, data_dir, out_dir):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    from taser.models.biencoder import load_tokenizer
    from taser.training.distributed import init_distributed

    init_distributed("gloo")
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
    torch.distributed.destroy_process_group()


def test_two_processes_match_one(tmp_path, tiny_pretrained, tokenizer, mini_squad):
    mp.spawn(_worker, args=(2, _free_port(), tiny_pretrained, mini_squad, tmp_path), nprocs=2, join=True)
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
