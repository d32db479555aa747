"""Trainer behaviour on a tiny random BERT: resume equality, gradient caching, accumulation."""

import json

import pytest
import torch
from conftest import tiny_model_cfg
from safetensors.torch import load_file
from torch.optim.optimizer import register_optimizer_step_pre_hook

from taser.data.biencoder_json import BiEncoderJsonFile
from taser.models.loading import load_model
from taser.pipeline.train import run_training
from taser.training.batching import collate, example_rng, make_example
from taser.training.config import TrainConfig
from taser.training.loss import LossConfig
from taser.training.sampler import MultiSetSchedule
from taser.training.step import StepRunner, trim_padding
from taser.training.trainer import linear_schedule

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
    # pinned: these tests compare runs to float32 tolerance (or exactly); `auto` is bf16 on a CPU
    # with native bf16 and would put the tests on a GPU where one exists
    precision="fp32",
    device="cpu",
)


def _weights(path):
    return load_file(str(path / "model.safetensors"))


@pytest.mark.parametrize("model_type", ["dpr", "shared"])
def test_resume_mid_epoch_ends_with_same_weights(tmp_path, tiny_pretrained, mini_squad, model_type):
    """Would catch a resume that ignores the checkpoint and starts over (same seeds, same weights)."""
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
    steps_run = []
    resumed = run_training(model_cfg, train, {**TRAIN, "resume": True}, tmp_path / "killed", dev_file=str(mini_squad / "dev.json"),
                           on_step=lambda step, record: steps_run.append(step))
    assert resumed.steps == 6
    # it continued from the checkpoint of step 3: steps 1-3 were not redone
    assert steps_run == [4, 5, 6]
    assert [r["step"] for r in resumed.history] == [4, 5, 6]
    for mine, theirs in zip(resumed.history, straight.history[3:]):
        assert mine["loss"] == theirs["loss"] and mine["lr"] == theirs["lr"], mine["step"]
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
    assert float(cached.loss_sum) == pytest.approx(float(plain.loss_sum), rel=1e-5)
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
    """Would catch trimming that cuts real tokens, or a padded encoder pass that lets padding in (mask ignored)."""
    # the padded path (unpad off): with the default padding-free path both inputs would be packed
    # to the same real tokens and compare equal whatever the padding does
    model, _ = load_model(tiny_model_cfg(tiny_pretrained, "shared", unpad=False))
    model.eval()
    texts = ["a short one", "a much longer question about the history of the university of chicago"]
    fixed = tokenizer(texts, padding="max_length", max_length=64, return_tensors="pt")
    trimmed = trim_padding(dict(fixed), fixed["attention_mask"].sum(1).tolist())
    longest = tokenizer(texts, padding="longest", return_tensors="pt")
    assert torch.equal(trimmed["input_ids"], longest["input_ids"]) and torch.equal(trimmed["attention_mask"], longest["attention_mask"])
    assert trimmed["input_ids"].shape[1] < 64 and bool(trimmed["attention_mask"][0, -1] == 0)  # trimmed, padding still in row 0
    shapes = []
    hook = model.question_encoder.register_forward_pre_hook(lambda m, args, kwargs: shapes.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True)
    try:
        with torch.no_grad():
            a = model.encode(trimmed["input_ids"], trimmed["attention_mask"], "question")
            b = model.encode(fixed["input_ids"], fixed["attention_mask"], "question")
    finally:
        hook.remove()
    assert shapes == [(2, trimmed["input_ids"].shape[1]), (2, 64)]  # the padded path ran (not packed to (1, tokens))
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    # the padding matters on this path: without its mask the vectors differ
    with torch.no_grad():
        unmasked = model.encode(fixed["input_ids"], torch.ones_like(fixed["attention_mask"]), "question")
    assert not torch.allclose(unmasked, b, rtol=1e-3, atol=1e-3)


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


def test_linear_schedule_warms_up_then_decays_to_zero():
    """Would catch an off-by-one or a wrong slope in the warm-up or the decay of the learning rate."""
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=0.8)
    schedule = linear_schedule(optimizer, warmup=3, total=10)
    applied = []
    for _ in range(11):
        applied.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    # step i (0-based) runs at (i + 1) / (warmup + 1) during the warm-up, then (total - i) / (total - warmup)
    expected = [1 / 4, 2 / 4, 3 / 4, 7 / 7, 6 / 7, 5 / 7, 4 / 7, 3 / 7, 2 / 7, 1 / 7, 0 / 7]
    assert applied == pytest.approx([0.8 * f for f in expected], rel=1e-12, abs=0)
    no_warmup = torch.optim.SGD([param], lr=1.0)
    linear_schedule(no_warmup, warmup=0, total=4)
    assert no_warmup.param_groups[0]["lr"] == 1.0  # no warm-up: the first step runs at the full rate


@pytest.mark.parametrize("clip", [1e-4, 1e6])
def test_gradients_are_clipped_to_the_clip_value(tmp_path, tiny_pretrained, mini_squad, tokenizer, clip):
    """Would catch a clip that is not applied (or applied with another norm), a recorded grad_norm other
    than the step's, or a recorded lr other than the one the step ran at."""
    model_cfg = tiny_model_cfg(tiny_pretrained, "shared", dropout=0.0)
    train = {**TRAIN, "max_steps": 5, "warmup_steps": 2, "save_every": 0, "val_max_questions": 0, "grad_clip": clip}
    data = BiEncoderJsonFile(mini_squad / "train.json")
    # the first step's gradient norm, independently: its batch (the schedule's first, as the
    # batching rules draw it) through a plain step of the same model
    cfg = TrainConfig.from_value(train)
    first = MultiSetSchedule([len(data)], cfg.batch_size, cfg.seed).epoch(0)[0]
    examples = [make_example(data[i], cfg.hard_negatives, cfg.other_negatives, example_rng(cfg.seed, 0, d, i)) for d, i in first]
    model, _ = load_model(model_cfg)
    model.train()
    batch = collate(examples, tokenizer, model.config.max_question_length, model.config.max_length)
    StepRunner(model, cfg.loss_config(model.config), "fp32", torch.device("cpu")).run(batch, batch.size)
    norm = float(torch.cat([p.grad.double().flatten() for p in model.parameters() if p.grad is not None]).norm())

    seen = []  # (gradient norm, lr) as the optimizer applies them

    def spy(optimizer, args, kwargs):
        grads = [p.grad.double().flatten() for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        seen.append((float(torch.cat(grads).norm()), optimizer.param_groups[0]["lr"]))

    hook = register_optimizer_step_pre_hook(spy)  # every optimizer: the one the Trainer makes
    try:
        records = run_training(model_cfg, [str(mini_squad / "train.json")], train, tmp_path / "run").history
    finally:
        hook.remove()
    assert len(seen) == len(records) == 5
    assert records[0]["grad_norm"] == pytest.approx(norm, rel=1e-5)  # the norm before clipping
    for (applied, _), record in zip(seen, records):
        before = record["grad_norm"]
        # torch scales by clip / (norm + 1e-6) when the norm exceeds the clip value
        assert applied == pytest.approx(clip * before / (before + 1e-6) if before > clip else before, rel=1e-6), record["step"]
    if clip < 1:
        assert min(r["grad_norm"] for r in records) > 10 * clip  # every step was clipped, to the clip value
        assert all(applied == pytest.approx(clip, rel=1e-4) for applied, _ in seen)
    else:
        assert max(r["grad_norm"] for r in records) < clip  # no step was clipped
    # warm-up over 2 steps, then linear decay over the other 3; each record holds the rate its step ran at
    expected_lr = [1e-3 * f for f in (1 / 3, 2 / 3, 3 / 3, 2 / 3, 1 / 3)]
    assert [lr for _, lr in seen] == pytest.approx(expected_lr, rel=1e-12)
    assert [r["lr"] for r in records] == pytest.approx(expected_lr, rel=1e-12)
