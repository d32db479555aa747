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
from dataclasses import dataclass

import torch

from taser.training.distributed import all_reduce_sum

log = logging.getLogger(__name__)


@dataclass
class PendingStep:
    record: dict  # filled in place by read_steps: step, lr and precision at first
    loss_sum: torch.Tensor  # this rank's summed NLL over the step's micro-batches
    correct: torch.Tensor
    grad_norm: torch.Tensor | None  # None when not computed (no clipping, no gradient scaler)
    aux: dict[str, torch.Tensor]  # this rank's routing losses, averaged over micro-batches


def read_steps(pending: list[PendingStep], questions_per_step: int, skips_overflow: bool) -> list[dict]:
    """Fill each step's record with `loss` and `acc` (over every rank's questions), `grad_norm`
    and `aux_*` (this rank's), in one read, and return the records.

    A non-finite loss or gradient norm is an fp16 overflow when a gradient scaler runs
    (`skips_overflow`): its optimizer step was skipped and its scale lowered, so the record says
    `skipped` and a warning is logged. Without a scaler a non-finite loss is an error.
    """
    if not pending:
        return []
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
        overflow = not math.isfinite(record["loss"]) or (p.grad_norm is not None and not math.isfinite(grad_norm))
        if overflow and skips_overflow:
            record["skipped"] = True
            log.warning("step %d: fp16 overflow (loss %s, grad norm %s); the gradient scaler skipped the update and lowered its scale",
                        record["step"], record["loss"], grad_norm)
        elif not math.isfinite(record["loss"]):
            raise FloatingPointError(f"loss is {record['loss']} at step {record['step']}; lower train.learning_rate or check the data")
        records.append(record)
    return records
