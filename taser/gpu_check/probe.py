"""One (model type, size) on one device: the loss check's two sides and the training figures.

The check: one optimizer step's loss on the device, in the precision the hardware picked, against
the same step on the CPU in fp32, with the same initial weights (read from the same directory,
random parts from the same seed), the same first batch (the schedule and the negatives follow
the seed) and dropout 0. Under torchrun the device side is every rank's share of the batch and
the CPU side the whole batch in one process, which the library computes identically
(`taser.training.distributed`).
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
from pathlib import Path

import torch

from taser.gpu_check.job import GpuCheckJob, Size
from taser.gpu_check.sizes import model_settings
from taser.gpu_check.training import first_step_loss, measure_training
from taser.training.distributed import DistInfo

REFERENCE_DEVICE = torch.device("cpu")
REFERENCE_PRECISION = "fp32"


def run_name(model_type: str, size: Size) -> str:
    return f"{model_type} / {size.value}"


def _run_dir(work: Path, model_type: str, size: Size, what: str) -> Path:
    return work / "runs" / f"{model_type}-{size.value}-{what}"


def remove_run_dirs(work: Path, model_type: str, size: Size) -> None:
    """The training runs' checkpoints of (model type, size): nothing reads them after their figures."""
    for path in (work / "runs").glob(f"{model_type}-{size.value}-*"):
        shutil.rmtree(path, ignore_errors=True)


def reference_loss(job: GpuCheckJob, model_type: str, size: Size, source: str, train_file: str, world_size: int, work: Path) -> float:
    """The CPU fp32 loss of the first batch of `world_size` GPUs' questions (one process, dropout 0).

    Its CPU training leaves glibc's malloc as it found it (`keep_freed_memory` is process-wide and
    not undone): the process then measures the device, and records whether freed memory is kept."""
    settings = model_settings(job, model_type, size, source, dropout=0.0)
    with freed_memory_left_alone():
        return first_step_loss(job, settings, train_file, REFERENCE_DEVICE, REFERENCE_PRECISION, job.check.batch_size * world_size,
                               _run_dir(work, model_type, size, f"reference-{world_size}"))


@contextlib.contextmanager
def freed_memory_left_alone():
    from taser.runtime import FREED_MEMORY_ENV, keep_freed_memory

    if keep_freed_memory.cache_info().currsize:  # already decided in this process: nothing to protect
        yield
        return
    before = os.environ.get(FREED_MEMORY_ENV)
    os.environ[FREED_MEMORY_ENV] = "0"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(FREED_MEMORY_ENV, None)
        else:
            os.environ[FREED_MEMORY_ENV] = before
        keep_freed_memory.cache_clear()  # the next CPU run decides afresh


def numerics(precision: str, device: torch.device) -> str:
    """What the device computes in: the precision, or `tf32` for fp32 on a GPU whose float32 matrix
    products were allowed TF32 (`torch.set_float32_matmul_precision("high")`, `allow_tf32`)."""
    if precision == "fp32" and device.type == "cuda" and torch.get_float32_matmul_precision() != "highest":
        return "tf32"
    return precision


def compare(device_loss: float, reference: float, precision: str, job: GpuCheckJob) -> dict:
    """The check's verdict: |device - reference| <= tolerance(precision) x max(1, |reference|)."""
    reference = reference * (1.0 + job.check.perturb_reference)
    tolerance = job.check.tolerance.of(precision)
    difference = abs(device_loss - reference)
    scale = max(1.0, abs(reference))
    passed = math.isfinite(device_loss) and math.isfinite(reference) and difference <= tolerance * scale
    return {"device_loss": device_loss, "reference_loss": reference, "reference": f"CPU {REFERENCE_PRECISION}",
            "perturbed_by": job.check.perturb_reference or None, "precision": precision,
            "difference": difference, "relative_difference": difference / scale, "tolerance": tolerance, "passed": bool(passed)}


def device_check_loss(job: GpuCheckJob, model_type: str, size: Size, source: str, train_file: str, device: torch.device, precision: str,
                      work: Path, dist_info: DistInfo | None = None) -> float:
    """The device side of the check: the first step's loss in `precision`, dropout 0 (every rank's questions, under torchrun)."""
    settings = model_settings(job, model_type, size, source, dropout=0.0)
    return first_step_loss(job, settings, train_file, device, precision, job.check.batch_size, _run_dir(work, model_type, size, "check"),
                           dist_info)


def measured_run(job: GpuCheckJob, model_type: str, size: Size, source: str, train_file: str, device: torch.device, precision: str,
                 work: Path, dist_info: DistInfo | None = None):
    """({"parameters", "train"}, model, tokenizer): the measured run, with the model's own dropout, as training runs."""
    figures, parameters, model, tokenizer = measure_training(job, model_settings(job, model_type, size, source), train_file, device,
                                                             precision, _run_dir(work, model_type, size, "train"), dist_info)
    return {"parameters": parameters, "train": figures.as_dict()}, model, tokenizer
