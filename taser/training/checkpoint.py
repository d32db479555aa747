"""Resumable checkpoints: the model directory plus `trainer_state.pt` beside it.

The state holds the optimizer, scheduler, grad scaler, step (which fixes the data position,
mid-epoch included) and every rank's random states, so a resumed run continues exactly.

Each save is flushed to the disk and keeps the checkpoint before it in `<directory>.previous`:
resume reads back the newest checkpoint and, when it does not load (a node that crashed while
its files were reaching the disk), falls back to the previous one.
"""

from __future__ import annotations

import logging
import random
import shutil
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from taser.io import atomic_dir

log = logging.getLogger(__name__)

STATE_FILE = "trainer_state.pt"
WEIGHTS_FILE = "model.safetensors"


def _gpu_of(model) -> torch.device | str:
    """The GPU the run computes on (a single process may run on cuda:k with cuda:0 the current device)."""
    device = next((p.device for p in model.parameters()), None) if model is not None else None
    return device if device is not None and device.type == "cuda" else "cuda"


def rng_state(device: torch.device | str = "cuda") -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():  # this rank's own GPU only: another run may see other GPUs, or number them otherwise
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict, device: torch.device | str = "cuda") -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        cuda = state["cuda"]
        if isinstance(cuda, (list, tuple)):  # a checkpoint of an earlier version: every visible GPU's state, by index
            index = torch.device(device).index if torch.device(device).index is not None else torch.cuda.current_device()
            if index >= len(cuda):
                raise ValueError(f"the checkpoint holds random states of {len(cuda)} GPU(s) and this rank runs on cuda:{index}; "
                                 "resume under the GPU visibility it was saved with")
            cuda = cuda[index]
        torch.cuda.set_rng_state(cuda, device)


def all_ranks(obj) -> list:
    if dist.is_available() and dist.is_initialized():
        out = [None] * dist.get_world_size()
        dist.all_gather_object(out, obj)
        return out
    return [obj]


def save_checkpoint(directory, model, tokenizer, optimizer, scheduler, scaler, step: int, is_main: bool, extra: dict | None = None) -> None:
    rngs = all_ranks(rng_state(_gpu_of(model)))  # collective: every rank takes part
    if not is_main:
        return
    with atomic_dir(directory, previous=previous_checkpoint(directory)) as tmp:
        model.save_into(tmp, tokenizer)
        torch.save(
            {
                "step": step,
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
                "scaler": scaler.state_dict() if scaler is not None else None,
                "rng": rngs,
                "extra": extra or {},
            },
            Path(tmp) / STATE_FILE,
        )


def load_training_state(directory, optimizer, scheduler, scaler, rank: int) -> dict:
    state = torch.load(Path(directory) / STATE_FILE, map_location="cpu", weights_only=False)
    rngs = state["rng"]  # one per rank: checked before anything is loaded
    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    if len(rngs) != world:
        raise ValueError(f"{directory} was saved by {len(rngs)} processes and this run has {world}; resume with the same number "
                         f"({len(rngs)}): each process restores its own random state")
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    if scaler is not None and state["scaler"] is not None:
        scaler.load_state_dict(state["scaler"])
    params = [p for group in optimizer.param_groups for p in group["params"]][:1]
    set_rng_state(rngs[rank], params[0].device if params and params[0].device.type == "cuda" else "cuda")
    return state


def previous_checkpoint(directory) -> Path:
    directory = Path(directory)
    return directory.with_name(directory.name + ".previous")


def remove_checkpoint(directory) -> None:
    """Remove the resumable state (the checkpoint and its previous one): done with once the final model is written."""
    for path in (Path(directory), previous_checkpoint(directory)):
        shutil.rmtree(path, ignore_errors=True)


def has_checkpoint(directory) -> bool:
    return (Path(directory) / STATE_FILE).is_file() and (Path(directory) / WEIGHTS_FILE).is_file()


def checkpoint_loads(directory) -> bool:
    """Whether both files of the checkpoint are there and read back whole."""
    if not has_checkpoint(directory):
        return False
    from safetensors import safe_open

    try:
        with safe_open(str(Path(directory) / WEIGHTS_FILE), framework="pt") as f:  # refuses a file shorter than its header says
            f.keys()
        state = torch.load(Path(directory) / STATE_FILE, map_location="cpu", weights_only=False)
        return isinstance(state, dict) and "step" in state
    except Exception as error:  # noqa: BLE001 -- any failure to read means: not usable
        log.warning("checkpoint %s does not load: %s: %s", directory, type(error).__name__, error)
        return False


def usable_checkpoint(directory) -> Path | None:
    """The newest checkpoint of `directory` that loads: itself, else its previous one, else None."""
    for candidate in (Path(directory), previous_checkpoint(directory)):
        if has_checkpoint(candidate):
            if checkpoint_loads(candidate):
                return candidate
            log.warning("falling back from %s: it does not load", candidate)
    return None


def checkpoint_view(directory) -> dict | None:
    """What this process sees of the checkpoint it would resume from: its path, its state file's size
    and modification time; None when there is none that loads."""
    found = usable_checkpoint(directory)
    if found is None:
        return None
    stat = (found / STATE_FILE).stat()
    return {"path": str(found), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def agreed_checkpoint(directory, resume: bool) -> Path | None:
    """The checkpoint every rank resumes from, decided together (a collective): None to start from
    step 0; refused when the ranks see different checkpoints (a node-local output directory)."""
    views = all_ranks(checkpoint_view(directory) if resume else None)
    if any(view != views[0] for view in views):
        seen = "; ".join(f"rank {rank}: {view or 'no checkpoint'}" for rank, view in enumerate(views))
        raise RuntimeError(f"the ranks see different checkpoints in {directory} ({seen}): every rank must read the same output "
                           "directory (a shared file system, not a node-local copy); they would otherwise resume from different steps")
    if views[0] is None:
        if resume:
            log.info("train.resume=true but no checkpoint in %s: starting from scratch", directory)
        return None
    return Path(views[0]["path"])
