"""Compiled training (`train.compile=true`): bucketing bounds the compiles and keeps the maths;
the compiler's caches serve a second run in a fresh process; settings that cannot compile are
refused with a clear message."""

import copy
import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import ROOT, tiny_model_cfg

from taser.data.biencoder_json import BiEncoderJsonFile
from taser.models.loading import load_model
from taser.pipeline.train import run_training
from taser.training.batching import Example, collate
from taser.training.compile_plan import bucket_for, bucket_lengths
from taser.training.compiled import CompiledEncoding, pad_inputs
from taser.training.config import TrainConfig
from taser.training.loss import LossConfig
from taser.training.step import StepRunner


def test_buckets():
    assert bucket_lengths(256, 4) == [64, 128, 192, 256]
    assert bucket_lengths(32, 2) == [16, 32]
    assert bucket_lengths(10, 4) == [8, 10]  # multiples of 8, never past max_length
    assert [bucket_for(n, [16, 32]) for n in (1, 16, 17, 32)] == [16, 16, 32, 32]
    padded = pad_inputs({"input_ids": torch.tensor([[5, 6, 7]]), "attention_mask": torch.tensor([[1, 1, 0]])}, rows=2, length=5, pad_token_id=0)
    assert padded["input_ids"].tolist() == [[5, 6, 7, 0, 0], [0, 0, 0, 0, 0]]
    assert padded["attention_mask"].tolist() == [[1, 1, 0, 0, 0], [1, 0, 0, 0, 0]]  # a dummy row keeps one token: no all-masked row


def _batches(tokenizer, records, batch_size):
    """Batches whose sides are padded to many different lengths (each batch truncated to its own
    limits), one with a question short of a negative (fewer passage rows)."""
    limits = [(10, 20), (14, 28), (20, 36), (26, 44), (32, 56), (12, 64), (30, 30)]
    batches = []
    for i, (q_max, p_max) in enumerate(limits):
        rows = records[i * batch_size:(i + 1) * batch_size]
        examples = [Example(r["question"], [r["positive_ctxs"][0], *r["negative_ctxs"][:1]]) for r in rows]
        if i == 3:
            examples[1].passages = examples[1].passages[:1]  # no negative: 7 passage rows instead of 8
        batches.append(collate(examples, tokenizer, q_max, p_max))
    return batches


def _assert_same(mine: dict, theirs: dict, rtol: float) -> None:
    """Each tensor within `rtol` of its counterpart, relative to its size, plus float rounding of
    all of them together (1e-5 of their norm), for tensors that are (near) zero in exact
    arithmetic (a key bias's gradient; the last LayerNorm bias of the passages under in-batch softmax)."""
    with torch.no_grad():
        total = float(torch.cat([t.flatten() for t in theirs.values()]).norm())
        for name, t in theirs.items():
            assert float((mine[name] - t).norm()) <= rtol * float(t.norm()) + 1e-5 * total, name


@pytest.mark.slow
def test_bucketing_bounds_compiles_and_keeps_the_loss(tmp_path, tiny_pretrained, mini_squad):
    """Would catch a bucketing that lets raw lengths (or row counts) through to the compiled
    encoders (more graphs than buckets), or padding that changes the maths (unmasked pads,
    dummy passage rows in the loss): the compiled run's losses, gradients and weights must equal
    the eager run's."""
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    model, tokenizer = load_model(tiny_model_cfg(tiny_pretrained, "dpr", dropout=0.0, max_length=64, max_question_length=32))
    eager_model = copy.deepcopy(model)
    eager_model.unpad = False  # padded as the compiled pass runs: same sums, so near-tied top-1 scores break alike
    model.train(), eager_model.train()
    records = list(BiEncoderJsonFile(str(mini_squad / "train.json")))
    batch_size = 4
    batches = _batches(tokenizer, records, batch_size)
    raw_shapes = {(side, tuple(t["input_ids"].shape)) for b in batches for side, t in (("q", b.questions), ("p", b.passages))}
    counter = CompileCounter()
    buckets = {"question": bucket_lengths(32, 2), "passage": bucket_lengths(64, 2)}
    compiled = CompiledEncoding(buckets["question"], buckets["passage"], batch_size * 2, tokenizer.pad_token_id, tmp_path / "cache",
                                backend=counter)
    loss_cfg = LossConfig("dot", 1.0, True)
    runners = {"compiled": StepRunner(model, loss_cfg, "fp32", torch.device("cpu"), compiled=compiled),
               "eager": StepRunner(eager_model, loss_cfg, "fp32", torch.device("cpu"))}
    optimizers = {"compiled": torch.optim.SGD(model.parameters(), lr=0.05), "eager": torch.optim.SGD(eager_model.parameters(), lr=0.05)}
    for batch in batches:
        stats = {name: runner.run(batch, batch_size) for name, runner in runners.items()}
        torch.testing.assert_close(stats["compiled"].loss_sum, stats["eager"].loss_sum, rtol=1e-5, atol=1e-4)
        assert int(stats["compiled"].correct) == int(stats["eager"].correct)
        # sums over more (padded, zero) positions, in another order: equal to rounding (a pad that
        # counted, or a dummy row in the loss, would be off by a whole token's or passage's share)
        _assert_same({n: p.grad for n, p in model.named_parameters() if p.grad is not None},
                     {n: p.grad for n, p in eager_model.named_parameters() if p.grad is not None}, 1e-3)
        for opt in optimizers.values():
            opt.step()
            opt.zero_grad(set_to_none=True)
    _assert_same(dict(model.named_parameters()), dict(eager_model.named_parameters()), 1e-4)
    assert model.encoder_call is None  # compiled only inside the training step
    report = compiled.report()
    # two encoders (dpr), each seeing one side: at most one graph per bucket of its side
    assert len(raw_shapes) == 14  # without buckets: a graph per raw shape
    assert counter.frame_count == report["graphs"] == len(report["shapes"]) <= len(buckets["question"]) + len(buckets["passage"])
    assert {tuple(s) for s in report["shapes"]} == {("question", 4, 16), ("question", 4, 32), ("passage", 8, 32), ("passage", 8, 64)}


def _compiled_run(out, pretrained, data, cache):
    """A tiny compiled training in a fresh process, as a user starts it."""
    cmd = [sys.executable, str(ROOT / "scripts" / "train.py"), "model=shared", f"model.pretrained={pretrained}", "model.max_length=32",
           "model.max_question_length=32", f"data.data_dir={data}", f"output_dir={out}", "train.batch_size=4", "train.hard_negatives=0",
           "train.max_steps=2", "train.warmup_steps=1", "train.val_max_questions=0", "train.progress=false", "train.save_every=0",
           "train.precision=fp32", "train.device=cpu", "train.compile=true", "train.compile_buckets=1", f"train.compile_cache_dir={cache}"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"compiler caches in {cache}" in proc.stderr
    return json.loads((out / "train_summary.json").read_text())["compile"]


@pytest.mark.rehearsal
@pytest.mark.slow
def test_second_run_compiles_from_the_cache(tmp_path, tiny_pretrained, mini_squad):
    """Would catch caches left off, kept in a per-process or per-run place, or keyed on something
    that differs between two runs of the same settings: the second process must find every graph
    in inductor's FX graph cache (its hit counter, not timing) and compile nothing afresh."""
    cache = tmp_path / "compile-cache"
    first = _compiled_run(tmp_path / "first", tiny_pretrained, mini_squad, cache)
    assert first["shapes"] == [["passage", 4, 32], ["question", 4, 32]]  # one bucket, one shape: one graph, forward and backward
    assert first["graphs"] == 1
    assert first["fxgraph_cache_miss"] >= 1 and first["fxgraph_cache_hit"] == 0
    second = _compiled_run(tmp_path / "second", tiny_pretrained, mini_squad, cache)
    assert second["graphs"] == 1 and second["cache_dir"] == str(cache)
    cached = second["fxgraph_cache_hit"] + second["autograd_cache_hit"]
    assert cached >= 1 and second["fxgraph_cache_miss"] == 0 and second["autograd_cache_miss"] == 0


def test_refusals_are_clear_and_early(tmp_path, tiny_pretrained, mini_squad, monkeypatch):
    """Settings that cannot compile fail at once, naming the setting and the way out."""
    with pytest.raises(ValueError, match=r"train.compile=true cannot be combined with gradient caching \(train.grad_cache_chunk=2\)"):
        TrainConfig(compile=True, grad_cache_chunk=2)
    monkeypatch.setenv("CXX", "no-such-c++")
    with pytest.raises(ValueError, match="train.compile=true needs a C\\+\\+ compiler .*'no-such-c\\+\\+' is not on the PATH"):
        TrainConfig(compile=True)
    TrainConfig(compile=False)  # no compiler needed without compiling
    monkeypatch.delenv("CXX")
    out = tmp_path / "run"
    with pytest.raises(ValueError, match="train.compile=true cannot run with model.unpad=true"):
        run_training(tiny_model_cfg(tiny_pretrained, "dpr", unpad=True), [str(mini_squad / "train.json")],
                     {"compile": True, "max_steps": 1, "progress": False, "device": "cpu"}, out)
    taser = tiny_model_cfg(tiny_pretrained, "taser", taser={"specialize_every": 1, "routing": "learned_token"})
    with pytest.raises(ValueError, match="cannot run with TASER's learned routing"):
        run_training(taser, [str(mini_squad / "train.json")], {"compile": True, "max_steps": 1, "progress": False, "device": "cpu"}, out)
    assert not out.exists()  # refused before anything was written
