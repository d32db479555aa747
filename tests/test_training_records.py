"""`taser.training.records.read_steps` on hand-made steps: the figures each record gets (losses and
accuracy over the step's questions, the gradient norm, each step's own routing losses), what an
fp16 overflow writes and logs, and the messages that stop a run, compared whole."""

import logging
import math

import pytest
import torch

from taser.training.records import NonFiniteLosses, PendingStep, read_steps


def step(n: int, loss: float, correct: float, grad_norm: float | None = None, **aux: float) -> PendingStep:
    return PendingStep({"step": n, "lr": 1e-5}, torch.tensor(loss), torch.tensor(correct),
                       None if grad_norm is None else torch.tensor(grad_norm), {k: torch.tensor(v) for k, v in aux.items()})


def test_each_record_gets_its_steps_figures_over_the_steps_questions():
    records = read_steps([step(1, 8.0, 3.0, 2.5, balance=0.25), step(2, 4.0, 2.0, None, router=0.5), step(3, 2.0, 4.0, 1.0)], 4, False)
    assert records == [
        {"step": 1, "lr": 1e-5, "loss": 2.0, "acc": 0.75, "grad_norm": 2.5, "aux_balance": 0.25},
        {"step": 2, "lr": 1e-5, "loss": 1.0, "acc": 0.5, "grad_norm": records[1]["grad_norm"], "aux_router": 0.5},
        {"step": 3, "lr": 1e-5, "loss": 0.5, "acc": 1.0, "grad_norm": 1.0},
    ]
    assert math.isnan(records[1]["grad_norm"])  # not computed: NaN, not a norm of 0
    assert read_steps([], 4, False) == []


def test_an_fp16_overflow_is_recorded_as_skipped_and_logged(caplog):
    caplog.set_level(logging.WARNING, logger="taser.training.records")
    records = read_steps([step(7, 1.0, 1.0, float("inf")), step(8, 2.0, 1.0, 1.5)], 2, True)  # no tracker given: one of its own
    assert records[0]["skipped"] is True and "skipped" not in records[1]
    assert caplog.messages == ["step 7: fp16 overflow (loss 0.5, grad norm inf); the gradient scaler skipped the update and lowered its scale"]
    caplog.clear()
    records = read_steps([step(9, float("nan"), 1.0, 1.5)], 2, True, NonFiniteLosses(limit=3))
    assert records[0]["skipped"] is True
    assert caplog.messages == ["step 9: fp16 overflow (loss nan, grad norm 1.5); the gradient scaler skipped the update and lowered its scale"]


def test_non_finite_fp16_losses_in_a_row_stop_the_run_and_a_finite_one_resets_the_count():
    tracker = NonFiniteLosses(limit=2)
    read_steps([step(1, float("nan"), 0.0, 1.0), step(2, 1.0, 0.0, 1.0), step(3, float("inf"), 0.0, 1.0)], 1, True, tracker)
    assert tracker.steps == [3]
    with pytest.raises(FloatingPointError) as stopped:
        read_steps([step(4, float("nan"), 0.0, 1.0)], 1, True, tracker)
    assert str(stopped.value) == (
        "loss is nan at 2 consecutive steps (3-4): the gradient scaler skipped each as an fp16 overflow, but a loss that is not finite before "
        "scaling is not cured by a lower scale. Nothing of these steps was saved; lower train.learning_rate, check the data, or train in "
        "bf16/fp32 (train.precision)")


def test_without_a_scaler_a_non_finite_loss_or_gradient_stops_the_run_with_the_whole_message():
    with pytest.raises(FloatingPointError) as stopped:
        read_steps([step(5, float("inf"), 0.0, 1.0)], 2, False)
    assert str(stopped.value) == ("loss is inf at step 5; nothing of this step was saved (the last checkpoint is intact); lower "
                                  "train.learning_rate or check the data")
    with pytest.raises(FloatingPointError) as stopped:
        read_steps([step(6, 3.0, 0.0, float("nan"))], 2, False)
    assert str(stopped.value) == (
        "gradient norm is nan at step 6 (loss 1.5000 is finite): non-finite gradients in (per-tensor norms not recorded). The optimizer "
        "applied them, so the run stops before this step is saved (the last checkpoint is intact); lower train.learning_rate, check the "
        "data, or train in fp32 (train.precision)")
    assert read_steps([step(7, 3.0, 0.0, None)], 2, False)[0]["loss"] == 1.5  # no norm computed is not a non-finite norm
