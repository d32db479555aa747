"""Training-log records whose figures stay on the device until a log line reads them.

Reading a device tensor (`float`, `.item()`, `.tolist()`) makes the host wait until the device
has computed it, which on a GPU empties the queue of work every micro-step. So a step leaves
its loss, accuracy, gradient norm and routing losses as device tensors in a `PendingStep`, and
`read_steps` reads all the steps since the last log line at once: one all-reduce over ranks
and one copy to the host.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

import torch

from taser.training.distributed import all_reduce_sum
from taser.training.grad_norms import GradNorms, describe_non_finite

log = logging.getLogger(__name__)


@dataclass
class PendingStep:
    record: dict  # filled in place by read_steps: step, lr and precision at first
    loss_sum: torch.Tensor  # this rank's summed NLL over the step's micro-batches
    correct: torch.Tensor
    grad_norm: torch.Tensor | None  # None when not computed (no clipping, no gradient scaler)
    aux: dict[str, torch.Tensor]  # this rank's routing losses, averaged over micro-batches
    norms: GradNorms | None = None  # per-tensor gradient norms: read only to name the culprits of a non-finite norm


DEFAULT_MAX_NONFINITE_LOSSES = 3


@dataclass
class NonFiniteLosses:
    """Consecutive fp16 steps whose loss was not finite. The gradient scaler skips such a step as an
    overflow, but the loss is computed before scaling, so lowering the scale cannot cure it:
    `limit` of them in a row stop the run."""

    limit: int = DEFAULT_MAX_NONFINITE_LOSSES
    steps: list[int] = field(default_factory=list)

    def see(self, step: int, loss: float) -> None:
        if math.isfinite(loss):
            self.steps = []
            return
        self.steps.append(step)
        if len(self.steps) >= self.limit:
            raise FloatingPointError(
                f"loss is {loss} at {len(self.steps)} consecutive steps ({self.steps[0]}-{self.steps[-1]}): the gradient scaler skipped "
                "each as an fp16 overflow, but a loss that is not finite before scaling is not cured by a lower scale. Nothing of "
                "these steps was saved; lower train.learning_rate, check the data, or train in bf16/fp32 (train.precision)")


def read_steps(pending: list[PendingStep], questions_per_step: int, skips_overflow: bool,
               nonfinite: NonFiniteLosses | None = None) -> list[dict]:
    """Fill each step's record with `loss` and `acc` (over every rank's questions), `grad_norm`
    and `aux_*` (this rank's), in one read, and return the records.

    With a gradient scaler (fp16, `skips_overflow`) a non-finite loss or gradient norm is an
    overflow: the scaler skipped the optimizer step and lowered its scale, so the record says
    `skipped` and a warning is logged; `nonfinite` (kept across calls by the trainer) stops the run
    after its limit of non-finite losses in a row. Without a scaler a non-finite loss or gradient
    norm is an error: the optimizer applied it, so the run stops here, before the step's
    checkpoint is written (the trainer reads every step before it saves).
    """
    if not pending:
        return []
    nonfinite = nonfinite if nonfinite is not None else NonFiniteLosses()
    nan = torch.tensor(float("nan"), dtype=torch.float64, device=pending[0].loss_sum.device)
    summed = all_reduce_sum(torch.stack([torch.stack([p.loss_sum.double(), p.correct.double()]) for p in pending]))
    keys = sorted({k for p in pending for k in p.aux})
    local = torch.stack([torch.stack([(p.grad_norm.double() if p.grad_norm is not None else nan)] +
                                     [p.aux[k].double() if k in p.aux else nan for k in keys]) for p in pending])
    rows = torch.cat([summed, local], dim=1).tolist()  # the one host read
    records = []
    for p, (loss_sum, correct, grad_norm, *aux) in zip(pending, rows):
        record = p.record
        record.update({"loss": loss_sum / questions_per_step, "acc": correct / questions_per_step, "grad_norm": grad_norm})
        record.update({f"aux_{k}": v for k, v in zip(keys, aux) if k in p.aux})
        bad_loss = not math.isfinite(record["loss"])
        bad_grad = p.grad_norm is not None and not math.isfinite(grad_norm)
        if skips_overflow:
            nonfinite.see(record["step"], record["loss"])
            if bad_loss or bad_grad:
                record["skipped"] = True
                log.warning("step %d: fp16 overflow (loss %s, grad norm %s); the gradient scaler skipped the update and lowered its scale",
                            record["step"], record["loss"], grad_norm)
        elif bad_loss:
            raise FloatingPointError(f"loss is {record['loss']} at step {record['step']}; nothing of this step was saved (the last "
                                     "checkpoint is intact); lower train.learning_rate or check the data")
        elif bad_grad:
            culprits = describe_non_finite(p.norms) if p.norms is not None else "(per-tensor norms not recorded)"
            raise FloatingPointError(
                f"gradient norm is {grad_norm} at step {record['step']} (loss {record['loss']:.4f} is finite): non-finite gradients in "
                f"{culprits}. The optimizer applied them, so the run stops before this step is saved (the last checkpoint is intact); "
                "lower train.learning_rate, check the data, or train in fp32 (train.precision)")
        records.append(record)
    return records
