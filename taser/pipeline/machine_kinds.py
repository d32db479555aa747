"""One recipe, one stage, whatever machine a job lands on.

A stage's key holds what the machine resolves (`precision: auto`: bf16 on an A100/H100, fp16 on a V100;
a CPU's training threads). A job that needs a stage another row's job built on another kind of machine
finds it here among the store's records (same settings but those parts, same inputs: proven by its key);
two such stages are refused naming both (`RecipeSplit`), as is a row's own training about to start a
second one under this machine's precision.
"""

from __future__ import annotations

from collections.abc import Callable

from taser.pipeline.stages import StageStore, stage_key

MACHINE_PARTS = ("precision", "cpu_threads")  # the parts of a training key that the machine resolves (precision auto, threads)


class StageNotPlanned(RuntimeError):
    """A sweep's job asked for another row's stage that is not in the store: it does not build it."""


class RecipeSplit(RuntimeError):
    """One recipe would be (or was) built under two machine-resolved keys (GPU generations)."""


def training_recipe(settings: dict, batch: bool = True) -> dict:
    """A training key's settings without the parts the machine resolves (and, with batch=False, the global batch)."""
    left_out = MACHINE_PARTS if batch else (*MACHINE_PARTS, "global_batch")
    return {**settings, "train": {k: v for k, v in settings.get("train", {}).items() if k not in left_out}}


def machine_parts(train: dict) -> str:
    return ", ".join(f"{k} {train[k]}" for k in ("global_batch", *MACHINE_PARTS) if k in train)


def found_elsewhere(store: StageStore, kind: str, inputs: dict, alike: Callable[[dict], bool], done_only: bool = True) -> list[dict]:
    """The records of `kind`'s stages (done, or also started) whose settings `alike` accepts and whose
    inputs are `inputs` (they are in the key: recomputed, not read)."""
    return [r for r in store.records_of(kind) if (r["done"] or not done_only) and alike(r.get("settings", {}))
            and stage_key(kind, r["settings"], inputs) == r["key"]]


def at_most_one(found: list[dict], what: str, describe: Callable[[dict], str], store: StageStore, pin: str) -> dict | None:
    """The one record of `found` (None if none); several: RecipeSplit naming each."""
    if len(found) > 1:
        raise RecipeSplit(f"{what} {len(found)} times, on different machine kinds: " + "; ".join(f"{r['key']} ({describe(r)})" for r in found)
                          + f": keep one (remove the others from {store.root}), or pin {pin}")
    return found[0] if found else None
