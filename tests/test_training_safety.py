"""A bad step never reaches a checkpoint: a non-finite gradient with a finite loss (fp32, bf16: no
gradient scaler) stops the run before the step's checkpoint is written, naming the step and the
parameter groups; non-finite fp16 losses in a row stop the run instead of being skipped for ever."""

import json
import math

import pytest
import torch
from conftest import tiny_model_cfg
from safetensors.torch import load_file

from taser.data.biencoder_json import BiEncoderJsonFile
from taser.models.loading import load_model
from taser.training.checkpoint import STATE_FILE, has_checkpoint
from taser.training.config import TrainConfig
from taser.training.grad_norms import clip_gradients, describe_non_finite, parameter_group
from taser.training.records import NonFiniteLosses, PendingStep, read_steps
from taser.training.step import StepRunner
from taser.training.trainer import Trainer

TRAIN = dict(batch_size=2, hard_negatives=1, other_negatives=0, max_steps=6, log_every=10, save_every=2, val_max_questions=0, progress=False,
             precision="fp32", device="cpu", warmup_steps=0, learning_rate=1e-3)
POISONED = "question_encoder.encoder.layer.1.attention.self.query.weight"


def _trainer(pretrained, tokenizer, data_dir, out, **train):
    torch.manual_seed(0)
    model, _ = load_model(tiny_model_cfg(pretrained, "dpr"))
    return Trainer(model, tokenizer, [BiEncoderJsonFile(data_dir / "train.json")], TrainConfig.from_value({**TRAIN, **train}), out)


def _poison_at(monkeypatch, trainer, bad_step: int, value: float = float("nan")):
    """A NaN (or `value`) in one gradient entry after the backward pass of step `bad_step` (1-based); the loss stays finite."""
    real = StepRunner.run
    calls = [0]
    param = dict(trainer.model.named_parameters())[POISONED]

    def run(self, *args, **kwargs):
        stats = real(self, *args, **kwargs)
        calls[0] += 1
        if calls[0] == bad_step:
            param.grad[0, 0] = value
        return stats

    monkeypatch.setattr(StepRunner, "run", run)


def test_a_nan_gradient_at_a_save_step_stops_the_run_before_its_checkpoint(tiny_pretrained, tokenizer, mini_squad, tmp_path, monkeypatch):
    """Would catch a non-finite gradient norm with a finite loss applied and saved over the last good
    checkpoint (fp32/bf16 have no scaler to skip it), or a checkpoint written before the step is read."""
    out = tmp_path / "run"
    trainer = _trainer(tiny_pretrained, tokenizer, mini_squad, out)
    saved = {}
    trainer.on_step = lambda step, record: saved.setdefault(step, load_file(str(out / "checkpoint" / "model.safetensors"))) if step == 2 else None
    _poison_at(monkeypatch, trainer, bad_step=4)
    with pytest.raises(FloatingPointError) as error:
        trainer.train()
    message = str(error.value)
    assert "at step 4" in message and "question_encoder.encoder.layer.1 (1 tensor, first " + POISONED in message
    assert "loss" in message and "finite" in message
    # the checkpoint of step 2 is intact and loadable: same tensors, all finite, its state at step 2
    assert has_checkpoint(out / "checkpoint")
    on_disk = load_file(str(out / "checkpoint" / "model.safetensors"))
    assert set(on_disk) == set(saved[2]) and all(torch.equal(on_disk[k], saved[2][k]) for k in on_disk)
    assert all(torch.isfinite(t).all() for t in on_disk.values() if t.is_floating_point())
    assert torch.load(out / "checkpoint" / STATE_FILE, weights_only=False)["step"] == 2
    assert not (out / "final").exists()
    assert [json.loads(line)["step"] for line in (out / "train_log.jsonl").read_text().splitlines()] == [1, 2]  # nothing of steps 3-4
    # and the run resumes from it to the end
    monkeypatch.undo()
    resumed = _trainer(tiny_pretrained, tokenizer, mini_squad, out, resume=True).train()
    assert resumed.steps == 6 and all(math.isfinite(r["loss"]) for r in resumed.history)


def test_an_infinite_gradient_norm_stops_the_run_as_a_nan_one_does(tiny_pretrained, tokenizer, mini_squad, tmp_path, monkeypatch):
    """Would catch only a NaN gradient norm stopping a run: an infinite one (one overflowed entry,
    the loss finite) was applied by the optimizer and its NaN weights saved over the last good checkpoint."""
    pending = PendingStep({"step": 7}, torch.tensor(2.0), torch.tensor(1.0), torch.tensor(float("inf")), {})
    with pytest.raises(FloatingPointError, match=r"gradient norm is inf at step 7 \(loss 1.0000 is finite\)"):
        read_steps([pending], 2, skips_overflow=False)
    out = tmp_path / "run"
    trainer = _trainer(tiny_pretrained, tokenizer, mini_squad, out, max_steps=3, save_every=1)
    _poison_at(monkeypatch, trainer, bad_step=2, value=float("inf"))
    with pytest.raises(FloatingPointError, match=f"gradient norm is inf at step 2 .*question_encoder.encoder.layer.1 \\(1 tensor, first {POISONED}"):
        trainer.train()
    assert torch.load(out / "checkpoint" / STATE_FILE, weights_only=False)["step"] == 1 and not (out / "final").exists()
    on_disk = load_file(str(out / "checkpoint" / "model.safetensors"))
    assert all(torch.isfinite(t).all() for t in on_disk.values() if t.is_floating_point())


def test_the_error_names_each_group_with_a_non_finite_gradient():
    model = torch.nn.ModuleDict({"a": torch.nn.Linear(2, 2), "b": torch.nn.Linear(2, 2)})
    named = [(f"question_encoder.encoder.layer.{i}.{n}", p) for i, (n, p) in enumerate(model.named_parameters())]
    for _, p in named:
        p.grad = torch.ones_like(p)
    named[1][1].grad[0] = float("inf")
    named[3][1].grad[0] = float("nan")
    norms = clip_gradients(named, 1.0)
    assert not torch.isfinite(norms.total)
    assert describe_non_finite(norms) == ("question_encoder.encoder.layer.1 (1 tensor, first question_encoder.encoder.layer.1.a.bias); "
                                          "question_encoder.encoder.layer.3 (1 tensor, first question_encoder.encoder.layer.3.b.bias)")
    assert parameter_group("passage_encoder.embeddings.word_embeddings.weight") == "passage_encoder.embeddings"


def test_clipping_equals_torchs(tiny_pretrained):
    """The per-tensor norms are measured without changing what clipping does."""
    torch.manual_seed(0)
    a, b = (torch.nn.Linear(4, 3) for _ in range(2))
    b.load_state_dict(a.state_dict())
    for model in (a, b):
        model(torch.randn(5, 4, generator=torch.Generator().manual_seed(1))).pow(2).sum().mul(100).backward()
    expected = torch.nn.utils.clip_grad_norm_(a.parameters(), 0.5)
    norms = clip_gradients(list(b.named_parameters()), 0.5)
    torch.testing.assert_close(norms.total, expected)
    assert all(torch.allclose(p.grad, q.grad) for p, q in zip(a.parameters(), b.parameters()))
    assert norms.names == ["weight", "bias"] and len(norms.per_tensor) == 2


def _nan_step(step: int, loss: float = float("nan")) -> PendingStep:
    return PendingStep({"step": step}, torch.tensor(loss * 2), torch.tensor(0.0), torch.tensor(float("inf")), {})


def test_non_finite_fp16_losses_in_a_row_stop_the_run():
    """Would catch a NaN loss counted as a gradient overflow for ever: the loss is computed before
    scaling, so the scaler's lower scale cannot cure it, and a run would end with every step skipped."""
    streak = NonFiniteLosses(limit=3)
    records = read_steps([_nan_step(1), _nan_step(2)], 2, skips_overflow=True, nonfinite=streak)
    assert all(r["skipped"] for r in records)  # a few are skipped, as overflows are
    with pytest.raises(FloatingPointError, match=r"loss is nan at 3 consecutive steps \(1-3\)"):
        read_steps([_nan_step(3)], 2, skips_overflow=True, nonfinite=streak)  # the streak carries across log lines
    # a finite loss in between resets it; a gradient overflow with a finite loss is skipped without counting
    streak = NonFiniteLosses(limit=2)
    read_steps([_nan_step(1), _nan_step(2, 1.0), _nan_step(3), _nan_step(4, 1.0)], 2, skips_overflow=True, nonfinite=streak)
    with pytest.raises(FloatingPointError, match="2 consecutive steps"):
        read_steps([_nan_step(5), _nan_step(6)], 2, skips_overflow=True, nonfinite=streak)


def test_the_trainer_counts_non_finite_fp16_losses_across_reads(tiny_pretrained, tokenizer, mini_squad, tmp_path, monkeypatch):
    """The trainer keeps the streak across log lines and takes its limit from train.max_nonfinite_losses."""
    trainer = _trainer(tiny_pretrained, tokenizer, mini_squad, tmp_path, log_every=1, save_every=0, max_nonfinite_losses=2)
    assert trainer._set_up().nonfinite.limit == 2
    monkeypatch.setattr(Trainer, "_set_up", lambda self, real=Trainer._set_up: _with_scaler(real(self)))
    real_run = StepRunner.run
    monkeypatch.setattr(StepRunner, "run", lambda self, *a, **k: _nan_loss(real_run(self, *a, **k)))
    with pytest.raises(FloatingPointError, match="at 2 consecutive steps"):
        trainer.train()
    assert not has_checkpoint(tmp_path / "checkpoint") and not (tmp_path / "final").exists()


def _with_scaler(loop):
    loop.scaler = torch.amp.GradScaler("cpu")  # as fp16 on a GPU
    return loop


def _nan_loss(stats):
    stats.loss_sum = stats.loss_sum * float("nan")
    return stats


def test_a_resumed_fp16_run_restores_its_gradient_scalers_scale(tiny_pretrained, tokenizer, mini_squad, tmp_path, monkeypatch):
    """Would catch the checkpoint dropping the gradient scaler's state (or a resume not loading it):
    the resumed run would start again from the initial scale, not the one its checkpoint saved."""
    scalers = []

    def set_up_with_scaler(self, real=Trainer._set_up):
        loop = real(self)
        loop.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=1)  # as fp16 on a GPU; doubles after each good step
        scalers.append(loop.scaler)
        return loop

    restored = []

    def resume_and_look(self, loop, real=Trainer._resume):
        step = real(self, loop)
        restored.append((step, loop.scaler.get_scale()))
        return step

    monkeypatch.setattr(Trainer, "_set_up", set_up_with_scaler)
    monkeypatch.setattr(Trainer, "_resume", resume_and_look)
    straight = _trainer(tiny_pretrained, tokenizer, mini_squad, tmp_path / "straight", max_steps=4, save_every=2).train()
    assert not any(r.get("skipped") for r in straight.history) and scalers[-1].get_scale() == 2.0**12  # 4 good steps: 2^8 doubled 4 times

    killed = _trainer(tiny_pretrained, tokenizer, mini_squad, tmp_path / "killed", max_steps=4, save_every=2)

    def killed_after_step_2(step, record):
        if step == 2:  # after the checkpoint of step 2
            raise KeyboardInterrupt

    killed.on_step = killed_after_step_2
    with pytest.raises(KeyboardInterrupt):
        killed.train()
    saved = torch.load(tmp_path / "killed" / "checkpoint" / STATE_FILE, weights_only=False)
    assert saved["step"] == 2 and saved["scaler"] is not None and saved["scaler"]["scale"] == 2.0**10
    resumed = _trainer(tiny_pretrained, tokenizer, mini_squad, tmp_path / "killed", max_steps=4, save_every=2, resume=True).train()
    assert restored[-1] == (2, 2.0**10)  # the saved scale, not the initial 2^8
    assert resumed.steps == 4 and scalers[-1].get_scale() == 2.0**12  # ends where the uninterrupted run ended
    assert torch.load(tmp_path / "killed" / "checkpoint" / STATE_FILE, weights_only=False)["scaler"]["scale"] == 2.0**12
    a, b = load_file(str(tmp_path / "straight" / "final" / "model.safetensors")), load_file(str(tmp_path / "killed" / "final" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
