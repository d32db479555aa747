"""`run_gpu_check`: what a user runs first on a GPU machine (`make gpu-check`).

On one device, for each size and model type: the loss check against the CPU in fp32, a short
measured training run, and encoding throughput (with sentence-transformers' beside it when it is
installed); then, with more than one GPU, the training part again on all of them under torchrun.
Writes `results.json` and `results.md` in `out_dir`, also when something fails; raises
`GpuCheckFailed` (the script exits non-zero) on a loss mismatch, an exception, or a non-finite
figure. With `device=cpu` and the tiny size it is a dry run of the whole path.
"""

from __future__ import annotations

import logging
import math
import shutil
import tempfile
import time
from pathlib import Path

import torch

from taser.gpu_check.data import CheckData, prepare_data
from taser.gpu_check.ddp import ddp_processes, launch, visible_gpus
from taser.gpu_check.encoding import encode_figures, peer_figures, peers_installed
from taser.gpu_check.features import feature_checks
from taser.gpu_check.job import GpuCheckJob, Mode, Size
from taser.gpu_check.probe import compare, device_check_loss, measured_run, numerics, reference_loss, remove_run_dirs, run_name
from taser.gpu_check.report import write_results
from taser.gpu_check.sizes import model_source
from taser.gpu_check.training import release
from taser.runtime import describe_hardware, hardware, pick_device, resolve_precision

log = logging.getLogger(__name__)

PEERS_MISSING = "sentence-transformers is not installed (pip install -e '.[peers]'): no peer figures"


class GpuCheckFailed(RuntimeError):
    """The check found problems (`failures`); `results` holds every figure it gathered."""

    def __init__(self, failures: list[str], results: dict, out_dir: str):
        self.failures, self.results = failures, results
        super().__init__(f"GPU check FAILED ({len(failures)} problem(s); figures in {out_dir}/results.md):\n"
                         + "\n".join(f"  - {f}" for f in failures))


def setup_name(device: torch.device, processes: int) -> str:
    if device.type == "cuda":
        return f"1 GPU ({torch.cuda.get_device_name(device)})" if processes == 1 else f"{processes} GPUs (torchrun, DDP)"
    return f"{device.type.upper()} (dry run)" if processes == 1 else f"{processes} {device.type.upper()} processes (torchrun, dry run)"


def _non_finite(value, where: str) -> list[str]:
    if isinstance(value, dict):
        return [bad for key, v in value.items() for bad in _non_finite(v, f"{where}.{key}")]
    if isinstance(value, float) and not math.isfinite(value):
        return [where]
    return []


def run_failures(setup: str, run: dict) -> list[str]:
    """What is wrong with one run: its error, a loss mismatch, non-finite figures."""
    name = f"{setup}, {run_name(run['model'], Size(run['size']))}"
    found = [f"{name}: {run['error']}"] if run.get("error") else []
    check = run.get("check")
    if check is not None and not check["passed"]:
        forced = f", x (1 + check.perturb_reference={check['perturbed_by']:g})" if check.get("perturbed_by") else ""
        found.append(f"{name}: loss mismatch: {check['device_loss']:.6f} on the device ({check['precision']}) vs {check['reference_loss']:.6f} "
                     f"on the CPU (fp32{forced}), relative difference {check['relative_difference']:.2e} > tolerance {check['tolerance']:g}")
    elif check is None and not run.get("error"):
        found.append(f"{name}: no loss check result")
    bad = [w for part in ("train", "encode") for w in _non_finite(run.get(part) or {}, part)]
    if bad:
        found.append(f"{name}: non-finite figure(s): {', '.join(bad)}")
    return found


def _single_run(job: GpuCheckJob, model_type: str, size: Size, source: str, data: CheckData, device: torch.device, precision: str,
                work: Path) -> dict:
    run = {"model": model_type, "size": size.value}
    where = (job, model_type, size, source, data.train_file)
    try:
        reference = reference_loss(*where, 1, work)
        run["check"] = compare(device_check_loss(*where, device, precision, work), reference, numerics(precision, device), job)
        figures, model, tokenizer = measured_run(*where, device, precision, work)
        run.update(figures)
        run["encode"] = encode_figures(model, tokenizer, data.passages, data.questions, job.encode_batch_size, precision, device)
        del model
    except Exception as e:
        log.exception("%s failed", run_name(model_type, size))
        run["error"] = f"{type(e).__name__}: {e}"
    finally:
        release(device)
        remove_run_dirs(work, model_type, size)
    return run


def single_setup(job: GpuCheckJob, device: torch.device, precision: str, data: CheckData, sources: dict, work: Path) -> dict:
    setup = {"name": setup_name(device, 1), "world_size": 1, "device": str(device), "precision": precision, "runs": [], "peers": {},
             "peers_note": None}
    with_peers = job.peers and peers_installed()
    if not with_peers:
        setup["peers_note"] = PEERS_MISSING if job.peers else "peers=false: no sentence-transformers figures"
    for size in job.sizes:
        for model_type in job.models:
            setup["runs"].append(_single_run(job, model_type.value, size, sources[size], data, device, precision, work))
        if with_peers:
            try:
                setup["peers"][size.value] = peer_figures(sources[size], data.passages, data.questions, job.encode_batch_size, precision,
                                                          device, job.max_length)
            except Exception as e:
                log.exception("sentence-transformers on %s failed", size.value)
                setup["peers"][size.value] = {"error": f"{type(e).__name__}: {e}"}
            finally:
                release(device)
    first = job.sizes[0]  # the other training paths (gradient caching, accumulation, compiling, routing, resume, the reader): the first size
    setup["features"] = feature_checks(job, sources[first], first, data.train_file, device, precision, numerics(precision, device), work / "features")
    return setup


def ddp_setup(job: GpuCheckJob, processes: int, device: torch.device, precision: str, data: CheckData, sources: dict, work: Path) -> dict:
    """The training part on `processes` ranks under torchrun, each run checked against the CPU on the whole batch."""
    setup = {"name": setup_name(device, processes), "world_size": processes, "device": device.type, "precision": precision, "runs": []}
    references = {}
    for size in job.sizes:
        for model_type in job.models:
            try:
                references[model_type.value, size] = reference_loss(job, model_type.value, size, sources[size], data.train_file, processes, work)
            except Exception as e:
                log.exception("CPU reference of %s failed", run_name(model_type.value, size))
                references[model_type.value, size] = e
            finally:
                remove_run_dirs(work, model_type.value, size)
    result = launch(job, processes, data.train_file, sources, work)
    got = {(r["model"], r["size"]): r for r in result["runs"]}
    for size in job.sizes:
        for model_type in job.models:
            run = {"model": model_type.value, "size": size.value}
            figures, reference = got.get((model_type.value, size.value)), references[model_type.value, size]
            if figures is None:
                run["error"] = result.get("error") or "torchrun returned no figures"
            else:
                run.update(figures)
                device_loss = run.pop("device_loss")
                if isinstance(reference, Exception):
                    run["error"] = f"CPU reference: {type(reference).__name__}: {reference}"
                else:
                    run["check"] = compare(device_loss, reference, result.get("numerics", numerics(precision, device)), job)
            setup["runs"].append(run)
    if result.get("error") and len(got) == len(setup["runs"]):
        setup["error"] = result["error"]
    return setup


def _collect_failures(results: dict) -> list[str]:
    found = [results["stopped"]] if results.get("stopped") else []
    for setup in results["setups"]:
        if setup.get("error"):
            found.append(f"{setup['name']}: {setup['error']}")
        for run in setup["runs"]:
            found += run_failures(setup["name"], run)
        for feature in setup.get("features") or []:
            if feature.get("passed") is False:
                found.append(f"{setup['name']}, {feature['feature']}: {feature.get('error') or feature.get('detail')}")
        for size, peer in (setup.get("peers") or {}).items():
            if peer.get("error"):
                found.append(f"{setup['name']}, sentence-transformers / {size}: {peer['error']}")
    return found


def run_gpu_check(job: GpuCheckJob) -> dict:
    """The check; its results (also in out_dir/results.json and results.md). Raises GpuCheckFailed."""
    if job.mode != Mode.main:
        raise ValueError("mode=ddp is how the check starts its own torchrun ranks; run it with mode=main (the default)")
    start = time.perf_counter()
    device = pick_device(job.device)
    precision = resolve_precision(job.precision, device)
    out = Path(job.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if job.work_dir:
        Path(job.work_dir).mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="taser-gpu-check-", dir=job.work_dir))
    results = {"passed": None, "failures": [], "stopped": None, "machine": describe_hardware(device), "hardware": hardware(device), "device": str(device),
               "visible_gpus": visible_gpus(), "precision_requested": str(job.precision), "precision": precision, "job": job, "data": {}, "setups": []}
    log.info("GPU check on %s, precision %s (precision=%s)", results["machine"], precision, job.precision)
    try:
        processes = ddp_processes(job, device)  # a count this machine cannot run stops the check here, not after the first pass
        data = prepare_data(job.squad_json, work, job.passages, job.questions, job.articles)
        results["data"] = {"train_file": "SQuAD (shipped), converted", "passages": len(data.passages), "distinct_passages": data.corpus_passages,
                           "questions": len(data.questions), "distinct_questions": data.corpus_questions}
        sources = {size: model_source(size, work / "models", job.seed) for size in job.sizes}
        results["setups"].append(single_setup(job, device, precision, data, sources, work))
        write_results(out, results, time.perf_counter() - start)
        if processes:
            results["setups"].append(ddp_setup(job, processes, device, precision, data, sources, work))
    except Exception as e:
        log.exception("the GPU check stopped")
        results["stopped"] = f"stopped: {type(e).__name__}: {e}"
    finally:
        failures = _collect_failures(results)
        results["passed"] = not failures
        results["failures"] = failures
        write_results(out, results, time.perf_counter() - start)
        if job.keep_work:
            log.info("work directory kept: %s", work)
        else:
            shutil.rmtree(work, ignore_errors=True)
    if failures:
        raise GpuCheckFailed(failures, results, job.out_dir)
    log.info("GPU check passed in %.0f s: %s", time.perf_counter() - start, out / "results.md")
    return results
