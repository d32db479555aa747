"""One torchrun rank of the GPU check (`python -m taser.gpu_check.rank spec.json`, started
by `taser.gpu_check.ddp.launch`, not by users).

Each rank trains every (model type, size) as in one-GPU mode (the check step and the measured
run); rank 0 gathers the ranks' figures and rewrites `figures.json` after each, so a run that
fails part-way still reports what finished. A rank that fails writes its traceback to
`error-rank<R>.txt` and exits; torchrun then stops the others, and the main process reports it.
"""

from __future__ import annotations

import json
import logging
import sys
import traceback
from pathlib import Path

import torch.distributed as dist

from taser.gpu_check.ddp import FIGURES
from taser.gpu_check.job import GpuCheckJob
from taser.gpu_check.probe import device_check_loss, measured_run, numerics, remove_run_dirs
from taser.gpu_check.training import release
from taser.io import atomic_open
from taser.runtime import pick_device, resolve_precision
from taser.training.distributed import destroy_distributed, init_distributed


def _merge(per_rank: list[dict]) -> dict:
    """One run's figures over the ranks: rank 0's rates (the ranks step together), the largest peak
    memory, the mean and lowest GPU utilisation."""
    run = dict(per_rank[0])
    train = dict(run["train"])
    train["peak_memory_gb"] = max(r["train"]["peak_memory_gb"] for r in per_rank)
    busy = [r["train"]["gpu_busy"] for r in per_rank]
    known = [b for b in busy if b is not None]
    train["gpu_busy"] = sum(known) / len(known) if known else None
    train["gpu_busy_min"] = min(known) if known else None
    run["train"] = train
    return run


def rank_main(spec_file: str) -> None:
    spec = json.loads(Path(spec_file).read_text(encoding="utf-8"))
    job = GpuCheckJob(**spec["job"])
    work = Path(spec["work"])
    info = init_distributed(device=job.device)
    logging.basicConfig(level=logging.INFO if info.is_main else logging.WARNING, stream=sys.stderr,
                        format=f"%(asctime)s %(levelname)s rank{info.rank} %(name)s: %(message)s", force=True)
    logging.getLogger("transformers").setLevel(logging.ERROR)
    device = pick_device(job.device)
    precision = resolve_precision(job.precision, device)
    result = {"world_size": info.world_size, "device": str(device), "precision": precision, "numerics": numerics(precision, device), "runs": []}
    try:
        for size in job.sizes:
            for model_type in job.models:
                where = (job, model_type.value, size, spec["sources"][size.value], spec["train_file"], device, precision, work, info)
                device_loss = device_check_loss(*where)
                figures, model, _ = measured_run(*where)
                figures["device_loss"] = device_loss
                del model
                release(device)
                per_rank = [None] * info.world_size
                dist.all_gather_object(per_rank, {"model": model_type.value, "size": size.value, **figures})
                if info.is_main:
                    result["runs"].append(_merge(per_rank))
                    with atomic_open(work / FIGURES) as f:
                        json.dump(result, f, indent=2)
                    remove_run_dirs(work, model_type.value, size)
        dist.barrier()
    except BaseException:
        (work / f"error-rank{info.rank}.txt").write_text(traceback.format_exc(), encoding="utf-8")
        raise
    finally:
        destroy_distributed()


if __name__ == "__main__":
    rank_main(sys.argv[1])
