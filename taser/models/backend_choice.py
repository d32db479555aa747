"""What `backend=auto` runs on a CPU: read from the record `benchmarks/peers/encode.py` writes per
CPU kind (`backend_speeds.json`, package data beside this module): each backend's median speed there
and its accuracy-gate verdict (`taser.evaluation.encoding_gate`).

- A recorded CPU kind (same model name, instruction set and native bf16): the fastest backend in
  passages/s that passed the gate and is installed here (`torch` always counts as passed).
- A CPU kind with no record: the fastest *exact* backend (float32: `torch`, `onnx`, `openvino`),
  ranked by its median speed-up over `torch` on the recorded kinds; `torch` when none is recorded.

Every choice comes with its reason, which the log states.
"""

from __future__ import annotations

import functools
import json
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import resources

FILE = "backend_speeds.json"
EXACT = ("torch", "onnx", "openvino")  # float32 throughout: the same maths as torch's fp32, to rounding
PASSES = "passes"


@dataclass(frozen=True)
class CpuKind:
    cpu: str  # the model name (/proc/cpuinfo)
    capability: str  # torch.backends.cpu.get_cpu_capability()
    native_bf16: bool

    def describe(self) -> str:
        return f"{self.cpu} ({self.capability}, {'native' if self.native_bf16 else 'no native'} bf16)"

    def matches(self, entry: dict) -> bool:
        return (entry["cpu"], entry["capability"], bool(entry["native_bf16"])) == (self.cpu, self.capability, self.native_bf16)


def this_cpu() -> CpuKind:
    import torch

    from taser.runtime import cpu_has_native_bf16, cpu_model

    return CpuKind(cpu_model(), torch.backends.cpu.get_cpu_capability(), cpu_has_native_bf16())


@functools.cache
def records() -> tuple[dict, ...]:
    return tuple(json.loads(resources.files(__package__).joinpath(FILE).read_text(encoding="utf-8"))["kinds"])


def record_for(kind: CpuKind, kinds: tuple[dict, ...] | None = None) -> dict | None:
    return next((entry for entry in (records() if kinds is None else kinds) if kind.matches(entry)), None)


def verdict(backend: str, measured: dict, recipes: Mapping[str, int]) -> str:
    """A recorded backend's verdict as it stands for this version: torch needs none; a verdict on
    another recipe of the backend than this version's (`recipes`: backend -> version, from
    `taser.models.backends.RECIPES`) is not this recipe's."""
    if backend == "torch":
        return PASSES
    current = recipes.get(backend)
    if measured.get("recipe") != current:
        return f"not judged: the record judged recipe {measured.get('recipe')}, this version makes recipe {current}"
    return measured.get("gate") or "not judged"


def gate_of(backend: str, kind: CpuKind, recipes: Mapping[str, int], kinds: tuple[dict, ...] | None = None) -> str | None:
    """The gate's verdict on `backend` recorded for `kind` ('passes', 'fails: ...', 'undecided: ...'), None if unrecorded."""
    entry = record_for(kind, kinds)
    if entry is None or backend not in entry["backends"]:
        return None
    return verdict(backend, entry["backends"][backend], recipes)


def choose(kind: CpuKind, installed: Callable[[str], bool], recipes: Mapping[str, int], kinds: tuple[dict, ...] | None = None) -> tuple[str, str]:
    """(backend, why) for `backend=auto` on a CPU of `kind`, among the backends `installed` accepts;
    `recipes`: each backend's recipe version in this version of taser."""
    kinds = records() if kinds is None else kinds
    entry = record_for(kind, kinds)
    if entry is not None:
        measured = sorted(entry["backends"].items(), key=lambda kv: -kv[1]["passages_per_s"])
        passed = [(b, m) for b, m in measured if verdict(b, m, recipes) == PASSES and installed(b)]
        if not passed:  # a record without torch's figures, and none of its backends passed and is installed here
            return "torch", f"no backend recorded for {kind.describe()} passed the accuracy gate and is installed here: torch"
        best, figures = passed[0]
        faster = [f"{b} {verdict(b, m, recipes).split(':')[0]}" for b, m in measured
                  if m["passages_per_s"] > figures["passages_per_s"] and verdict(b, m, recipes) != PASSES]  # torch, faster, would be the choice
        faster += [f"{b} not installed" for b, m in measured if m["passages_per_s"] > figures["passages_per_s"] and verdict(b, m, recipes) == PASSES
                   and not installed(b)]
        why = (f"the fastest backend that passed the accuracy gate on {kind.describe()} ({figures['passages_per_s']:g} passages/s, "
               f"{figures['questions_per_s']:g} questions/s; {entry['source']}, {entry['date']})")
        return best, why + (f"; faster but not taken: {', '.join(faster)}" if faster else "")
    ratios: dict[str, list[float]] = {}
    for other in kinds:
        torch_speed = other["backends"].get("torch", {}).get("passages_per_s")
        for b, m in other["backends"].items():
            if b in EXACT and torch_speed:
                ratios.setdefault(b, []).append(m["passages_per_s"] / torch_speed)
    ranked = sorted((b for b in ratios if installed(b)), key=lambda b: -statistics.median(ratios[b]))
    if not ranked:
        return "torch", f"no speed is recorded for {kind.describe()} or any other CPU kind: torch"
    best = ranked[0]
    return best, (f"no record for {kind.describe()}: the fastest exact backend on the {len(kinds)} recorded CPU kind(s) "
                  f"({statistics.median(ratios[best]):.2f}x torch's passages/s)")
