"""Resumable checkpoints: the model directory plus `trainer_state.pt` beside it.

The state holds the optimizer, scheduler, grad scaler, step (which fixes the data position,
mid-epoch included) and every rank's random states, so a resumed run continues exactly.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from taser.io import atomic_dir

STATE_FILE = "trainer_state.pt"


def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():  # this rank's own GPU only: another run may see other GPUs, or number them otherwise
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        cuda = state["cuda"]
        if isinstance(cuda, (list, tuple)):  # a checkpoint of an earlier version: every visible GPU's state, by index
            device = torch.cuda.current_device()
            if device >= len(cuda):
                raise ValueError(f"the checkpoint holds random states of {len(cuda)} GPU(s) and this rank runs on cuda:{device}; "
                                 "resume under the GPU visibility it was saved with")
            cuda = cuda[device]
        torch.cuda.set_rng_state(cuda)


def all_ranks(obj) -> list:
    if dist.is_available() and dist.is_initialized():
        out = [None] * dist.get_world_size()
        dist.all_gather_object(out, obj)
        return out
    return [obj]


def save_checkpoint(directory, model, tokenizer, optimizer, scheduler, scaler, step: int, is_main: bool, extra: dict | None = None) -> None:
    rngs = all_ranks(rng_state())  # collective: every rank takes part
    if not is_main:
        return
    with atomic_dir(directory) as tmp:
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
    set_rng_state(rngs[rank])
    return state


def checkpoint_view(directory) -> dict | None:
    """What this process sees of a checkpoint: its state file's size and modification time, or None."""
    if not has_checkpoint(directory):
        return None
    stat = (Path(directory) / STATE_FILE).stat()
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def has_checkpoint(directory) -> bool:
    return (Path(directory) / STATE_FILE).is_file() and (Path(directory) / "model.safetensors").is_file()
