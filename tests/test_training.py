"""Trainer behaviour on a tiny random BERT: resume equality, gradient caching, accumulation."""

import json

import pytest
import torch
from conftest import tiny_model_cfg
from safetensors.torch import load_file

from taser.data.biencoder_json import BiEncoderJsonFile
from taser.models.loading import load_model
from taser.pipeline.train import run_training
from taser.training.batching import collate, example_rng, make_example
from taser.training.loss import LossConfig
from taser.training.step import StepRunner

TRAIN = dict(
    batch_size=4,
    hard_negatives=1,
    other_negatives=1,
    learning_rate=1e-3,
    warmup_steps=2,
    max_steps=6,
    log_every=1,
    save_every=3,
    val_max_questions=8,
    progress=False,
    seed=7,
)


def _weights(path):
    return load_file(str(path / "model.safetensors"))


@pytest.mark.parametrize("model_type", ["dpr", "shared"])
def test_resume_mid_epoch_ends_with_same_weights(tmp_path, tiny_pretrained, mini_squad, model_type):
    model_cfg = tiny_model_cfg(tiny_pretrained, model_type)
    train = [str(mini_squad / "train.json")]
    straight = run_training(model_cfg, train, TRAIN, tmp_path / "straight", dev_file=str(mini_squad / "dev.json"))
    assert straight.steps == 6

    def crash(step, record):
        if step == 4:  # after the checkpoint of step 3, mid-epoch
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_training(model_cfg, train, TRAIN, tmp_path / "killed", on_step=crash, dev_file=str(mini_squad / "dev.json"))
    assert not (tmp_path / "killed" / "final").exists()
    resumed = run_training(model_cfg, train, {**TRAIN, "resume": True}, tmp_path / "killed", dev_file=str(mini_squad / "dev.json"))
    assert resumed.steps == 6
    a, b = _weights(tmp_path / "straight" / "final"), _weights(tmp_path / "killed" / "final")
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0, msg=k)
    log = [json.loads(line) for line in (tmp_path / "killed" / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2, 3, 4, 5, 6]
    assert "val_avg_rank" in log[-1] and "val_nll" in log[-1]


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _batch(tokenizer, mini_squad, n=6, hard=1, other=1):
    data = BiEncoderJsonFile(mini_squad / "train.json")
    examples = [make_example(data[i], hard, other, example_rng(0, 0, 0, i)) for i in range(n)]
    return collate(examples, tokenizer, 32, 64)


@pytest.mark.parametrize("model_type, in_batch", [("dpr", True), ("shared", False)])
def test_grad_cache_gives_the_plain_gradients(tiny_pretrained, tokenizer, mini_squad, model_type, in_batch):
    model, _ = load_model(tiny_model_cfg(tiny_pretrained, model_type, dropout=0.0))
    batch = _batch(tokenizer, mini_squad)
    loss_cfg = LossConfig("dot", 1.0, in_batch)
    plain = StepRunner(model, loss_cfg, "fp32", torch.device("cpu")).run(batch, batch.size)
    g_plain = _grads(model)
    model.zero_grad(set_to_none=True)
    cached = StepRunner(model, loss_cfg, "fp32", torch.device("cpu"), grad_cache_chunk=4).run(batch, batch.size)
    g_cached = _grads(model)
    assert cached.loss_sum == pytest.approx(plain.loss_sum, rel=1e-5)
    assert g_plain.keys() == g_cached.keys() and len(g_plain) > 10
    for k in g_plain:
        torch.testing.assert_close(g_cached[k], g_plain[k], rtol=1e-4, atol=1e-5, msg=k)


def test_grad_cache_replays_dropout(tiny_pretrained, tokenizer, mini_squad):
    """With dropout on, the chunk's second pass must draw the first pass's masks."""
    model, _ = load_model(tiny_model_cfg(tiny_pretrained, "shared", dropout=0.3))
    model.train()  # build_model leaves the encoders in eval mode; the Trainer calls train()
    batch = _batch(tokenizer, mini_squad, n=4)
    torch.manual_seed(3)
    StepRunner(model, LossConfig(), "fp32", torch.device("cpu"), grad_cache_chunk=64).run(batch, batch.size)
    g_cached = _grads(model)
    model.zero_grad(set_to_none=True)
    # one chunk per side = one forward per side, as the plain step does: same masks, same grads
    torch.manual_seed(3)
    StepRunner(model, LossConfig(), "fp32", torch.device("cpu")).run(batch, batch.size)
    g_plain = _grads(model)
    assert g_plain.keys() == g_cached.keys() and len(g_plain) > 10
    for k, g in g_plain.items():
        torch.testing.assert_close(g_cached[k], g, rtol=1e-4, atol=1e-5, msg=k)
    # dropout is on: another seed draws other masks and gives other gradients
    model.zero_grad(set_to_none=True)
    torch.manual_seed(4)
    StepRunner(model, LossConfig(), "fp32", torch.device("cpu")).run(batch, batch.size)
    g_other = _grads(model)
    assert any(not torch.allclose(g_other[k], g, rtol=1e-4, atol=1e-5) for k, g in g_plain.items())


def test_dynamic_padding_gives_fixed_padding_vectors(tiny_pretrained, tokenizer):
    model, _ = load_model(tiny_model_cfg(tiny_pretrained, "shared"))
    model.eval()
    texts = ["a short one", "a much longer question about the history of the university of chicago"]
    longest = tokenizer(texts, padding="longest", return_tensors="pt")
    fixed = tokenizer(texts, padding="max_length", max_length=64, return_tensors="pt")
    with torch.no_grad():
        a = model.encode(longest["input_ids"], longest["attention_mask"], "question")
        b = model.encode(fixed["input_ids"], fixed["attention_mask"], "question")
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_grad_accumulation_equals_bigger_batch(tmp_path, tiny_pretrained, mini_squad):
    """2 micro-batches of 2 in one step = 1 batch of 4 when negatives are not shared (1-of-N)."""
    # a large Adam epsilon keeps updates proportional to gradients, so float rounding in the
    # summation order cannot flip the sign of an update on a near-zero gradient
    # and fp32 (not `auto`, which is bf16 on a CPU with native bf16): bf16 rounds differently per batch split
    base = {**TRAIN, "max_steps": 2, "save_every": 0, "in_batch": False, "val_max_questions": 0, "adam_eps": 1e-3, "precision": "fp32"}
    model_cfg = tiny_model_cfg(tiny_pretrained, "shared", dropout=0.0)
    train = [str(mini_squad / "train.json")]
    run_training(model_cfg, train, {**base, "batch_size": 4}, tmp_path / "big")
    run_training(model_cfg, train, {**base, "batch_size": 2, "grad_accumulation": 2}, tmp_path / "acc")
    a, b = _weights(tmp_path / "big" / "final"), _weights(tmp_path / "acc" / "final")
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5, msg=k)
