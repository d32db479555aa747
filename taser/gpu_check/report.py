"""The GPU check's `results.json` (every figure) and `results.md` (tables to read), written
atomically, in full after every stage and again when the check ends (also when it fails)."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, is_dataclass
from pathlib import Path

from taser.io import atomic_open

COLUMNS = ("model", "size", "parameters", "loss: device / CPU fp32", "check", "steps/s", "questions/s (train)", "peak memory (GB)",
           "GPU busy", "passages/s (encode)", "questions/s (encode)")


def _fmt(value, spec: str, missing: str = "–") -> str:
    if value is None:
        return missing
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return format(value, spec)


def _millions(n) -> str:
    return "–" if n is None else f"{n / 1e6:.1f}M"


def _check_cell(check: dict | None) -> str:
    if check is None:
        return "–"
    verdict = "ok" if check["passed"] else "**MISMATCH**"
    return f"{verdict} ({check['relative_difference']:.1e} ≤ {check['tolerance']:g})" if check["passed"] else \
        f"{verdict} ({check['relative_difference']:.1e} > {check['tolerance']:g})"


def _row(run: dict) -> str:
    check, train, encode = run.get("check"), run.get("train") or {}, run.get("encode") or {}
    loss = f"{check['device_loss']:.6f} / {check['reference_loss']:.6f}" if check else "–"
    busy = train.get("gpu_busy")
    busy_cell = "n/a" if busy is None else f"{busy:.0%}" + (f" (min {train['gpu_busy_min']:.0%})" if train.get("gpu_busy_min") is not None else "")
    cells = [run["model"], run["size"], _millions(run.get("parameters")), loss, _check_cell(check), _fmt(train.get("steps_per_s"), ".2f"),
             _fmt(train.get("questions_per_s"), ".1f"), _fmt(train.get("peak_memory_gb"), ".2f"), busy_cell if train else "–",
             _fmt(encode.get("passages_per_s"), ".1f", "–"), _fmt(encode.get("questions_per_s"), ".1f", "–")]
    text = "| " + " | ".join(cells) + " |\n"
    if run.get("error"):
        text += f"| | | | error: {run['error'][:300]} | | | | | | | |\n"
    return text


def _peers(setup: dict, runs: list[dict]) -> str:
    if setup.get("peers_note"):
        return f"\n{setup['peers_note']}.\n"
    if not setup.get("peers"):
        return ""
    ours = {}
    for run in runs:  # the library's best passage rate per size, to set beside the peer's
        rate = (run.get("encode") or {}).get("passages_per_s")
        if rate is not None:
            ours[run["size"]] = max(rate, ours.get(run["size"], 0.0))
    text = "\nsentence-transformers on the same device, texts, batch and max length (weights cast to the precision used):\n\n"
    text += "| size | library | passages/s | questions/s | this library's passages/s, best model type (ratio) |\n|---|---|---|---|---|\n"
    for size, peer in setup["peers"].items():
        if peer.get("error"):
            text += f"| {size} | error: {peer['error'][:300]} | | | |\n"
            continue
        mine = ours.get(size)
        ratio = f"{mine:.1f} ({mine / peer['passages_per_s']:.2f}x)" if mine else "–"
        text += f"| {size} | {peer['library']} ({peer['dtype']}) | {peer['passages_per_s']:.1f} | {peer['questions_per_s']:.1f} | {ratio} |\n"
    return text


def _sync_debug(runs: list[dict]) -> str:
    """sync_debug=true: each run's count of implicit host-device syncs in its timed steps."""
    counted = [r for r in runs if (r.get("train") or {}).get("sync_warnings") is not None]
    if not counted:
        return ""
    text = "\nImplicit host-device syncs in the timed steps (torch.cuda.set_sync_debug_mode('warn'), sync_debug=true):\n\n"
    for run in counted:
        train = run["train"]
        sites = "; ".join(train.get("sync_sites") or [])
        text += f"- {run['model']} / {run['size']}: {train['sync_warnings']}" + (f" ({sites[:300]})" if sites else "") + "\n"
    return text


def multi_gpu_note(results: dict) -> str:
    """Whether the multi-process path ran, said plainly when it did not."""
    if any(setup.get("world_size", 1) > 1 for setup in results["setups"]):
        return ""
    job = results["job"]
    if results["device"].startswith("cuda") and results["visible_gpus"] == 1:
        why = "this host shows 1 GPU"
    elif job.get("ddp_processes") == 0:
        why = "ddp_processes=0"
    elif results.get("stopped"):
        why = "the check stopped before it"
    else:
        why = f"device {results['device']}, {results['visible_gpus']} GPU(s) visible"
    return (f"\n**The multi-GPU path (torchrun, DDP, gradients and passages exchanged between ranks) was not exercised: {why}.** "
            "Only the single-process figures above were checked.\n")


def _features(features: list[dict]) -> str:
    if not features:
        return ""
    rows = []
    for f in features:
        verdict = "skipped" if "skipped" in f else ("passed" if f.get("passed") else "**FAILED**")
        rows.append(f"| {f['feature']} | {verdict} | {f.get('skipped') or f.get('error') or f.get('detail', '')} |")
    return ("\n### Other training paths (the first size, a few steps each)\n\n| path | result | detail |\n|---|---|---|\n"
            + "\n".join(rows) + "\n")


def render(results: dict, seconds: float) -> str:
    job = results["job"]
    verdict = "running" if results["passed"] is None else ("PASSED" if results["passed"] else "FAILED")
    check = job["check"]
    memory_kind = "peak RSS of the process" if results["device"] == "cpu" else "torch.cuda.max_memory_allocated, the largest over ranks"
    data = results.get("data") or {}
    text = (
        f"# GPU check: {verdict}\n\n"
        f"Machine: {results['machine']}; {results['visible_gpus']} GPU(s) visible; torch {results['hardware']['torch']}; device {results['device']}; "
        f"precision **{results['precision']}** (precision={results['precision_requested']}, resolved from the hardware by taser.runtime). "
        f"{seconds:.0f} s in all.\n\n"
        f"- Training: {job['batch_size']} questions per GPU, each with its positive and {job['hard_negatives']} hard negative(s) plus "
        f"in-batch negatives; passages up to {job['max_length']} tokens, questions up to {job['max_question_length']}; "
        f"steps/s over {job['timed_steps']} steps after {job['warm_steps']} warm-up steps (the GPU waited for at their ends only); "
        f"questions/s = all GPUs' "
        f"questions per step x steps/s; GPU busy = union of CUDA kernel time / wall time over {job['profiled_steps']} profiled steps "
        f"(n/a on CPU); peak memory: {memory_kind}.\n"
        f"- Loss check: one step of {check['batch_size']} questions per GPU, dropout 0, against the same step on the CPU in fp32 "
        f"(same weights, same batch); passes when |difference| ≤ tolerance x max(1, |CPU loss|), tolerance by precision: "
        f"fp32 {check['tolerance']['fp32']:g} (TF32 matrix products: {check['tolerance']['tf32']:g}), bf16 {check['tolerance']['bf16']:g}, "
        f"fp16 {check['tolerance']['fp16']:g}.\n"
        f"- Encoding: {data.get('passages', '–')} passages ({data.get('distinct_passages', '–')} distinct, shipped SQuAD, "
        f"`title [SEP] text`) and {data.get('questions', '–')} questions, batch {job['encode_batch_size']}, after one warm-up batch.\n"
    )
    for setup in results["setups"]:
        text += f"\n## {setup['name']}\n\n| " + " | ".join(COLUMNS) + " |\n|" + "---|" * len(COLUMNS) + "\n"
        text += "".join(_row(run) for run in setup["runs"])
        if setup.get("error"):
            text += f"\n{setup['error']}\n"
        text += _peers(setup, setup["runs"])
        text += _sync_debug(setup["runs"])
        text += _features(setup.get("features") or [])
    text += multi_gpu_note(results)
    if results.get("failures"):
        text += "\n## Failures\n\n" + "".join(f"- {f}\n" for f in results["failures"])
    return text


def _jsonable(value):
    if is_dataclass(value):
        return _jsonable(asdict(value))
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # valid JSON, still visible
    return value


def write_results(out: Path, results: dict, seconds: float) -> None:
    data = _jsonable({**results, "seconds": seconds})
    with atomic_open(out / "results.json") as f:
        json.dump(data, f, indent=2)
    with atomic_open(out / "results.md") as f:
        f.write(render(data, seconds))
