"""The GPU check (`scripts/gpu_check.py`) as a dry run on the CPU: a tiny random BERT, a few steps,
a few dozen passages. Through the library: every figure present and finite, the loss check passed.
Through the script: two torchrun processes (the all-GPU path, gloo on the CPU), and a forced loss
mismatch that must make it exit non-zero."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import ROOT
from hydra import compose, initialize_config_dir
from torch.autograd import DeviceType

from taser.cli import CONFIG_DIR, typed
from taser.gpu_check import GpuCheckJob, run_gpu_check, training
from taser.gpu_check.check import run_failures
from taser.gpu_check.encoding import peers_installed
from taser.gpu_check.job import Size, register_schema
from taser.gpu_check.training import StepClock, busy_share, device_intervals
from taser.precision import Precision

# the dry run (configs/scale/dry_run.yaml), smaller still
DRY = dict(device="cpu", sizes=["tiny"], articles=3, batch_size=4, warm_steps=1, timed_steps=2, check={"batch_size": 2}, passages=32,
           questions=32, encode_batch_size=16, max_length=96, max_question_length=32, progress=False)
# one thread: the dry run's figures mean nothing, and on 2 cores shared with other jobs two threads
# per process wait on each other (a tiny step takes ~8x longer)
ONE_THREAD = {**os.environ, "OMP_NUM_THREADS": "1"}
DRY_OVERRIDES = ["scale=dry_run", "timed_steps=2", "passages=32", "questions=32", "max_length=96", "peers=false"]


def test_busy_share_counts_overlapping_kernels_once():
    assert busy_share([(0, 10), (5, 15), (20, 30)], 40) == pytest.approx(25 / 40)
    assert busy_share([(20, 30), (0, 10), (2, 3)], 30) == pytest.approx(20 / 30)
    assert busy_share([], 10) == 0.0


def test_device_intervals_keep_cuda_events_only():
    def event(kind, start, end):
        return SimpleNamespace(device_type=kind, time_range=SimpleNamespace(start=start, end=end))

    events = [event(DeviceType.CPU, 0, 100), event(DeviceType.CUDA, 10, 20), event(DeviceType.CUDA, 30, 35)]
    assert device_intervals(events) == [(10, 20), (30, 35)]


def test_step_clock_times_the_timed_steps_and_profiles_the_next_ones(monkeypatch):
    """The windows on a CPU profile (a GPU's is the same with CUDA activity): 2 warm steps, 3 timed,
    one profiler warm-up, 2 profiled (steps 7 and 8), and a last step."""
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    clock = StepClock(torch.device("cpu"), warm=2, timed=3, active=2)
    clock.profiler = profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=clock.skip, warmup=1, active=2, repeat=1),
                             on_trace_ready=clock._trace_ready)
    profiled = []

    def steps_seen(events):
        spans = [(e.time_range.start, e.time_range.end) for e in events if e.name.startswith("step ")]
        profiled.extend(sorted({e.name for e in events if e.name.startswith("step ")}))
        return spans

    monkeypatch.setattr(training, "device_intervals", steps_seen)
    clock.start()
    for step in range(1, 10):
        with record_function(f"step {step}"):
            torch.ones(64, 64) @ torch.ones(64, 64)
        clock(step, {})
    clock.stop()
    assert profiled == ["step 7", "step 8"]
    assert 0 < clock.gpu_busy <= 1 and sorted(clock.ends) == [2, 5, 6, 8]
    assert clock.timed_seconds == clock.ends[5] - clock.resumed[2] > 0


def test_sync_debug_counts_the_syncs_of_the_timed_steps_only(monkeypatch):
    """sync_debug=true: torch.cuda.set_sync_debug_mode("warn") from the first timed step to the last,
    its warnings counted (here a GPU is faked: the mode decides whether a step's work warns)."""
    import warnings

    mode = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", mode.append)
    clock = StepClock(torch.device("cuda", 0), warm=1, timed=2, active=0, sync_debug=True)
    for step in range(1, 5):
        if mode and mode[-1] == "warn":
            warnings.warn(f"called a synchronizing CUDA operation (step {step})", UserWarning, stacklevel=1)
        warnings.warn("something else", UserWarning, stacklevel=1)  # not a sync: not counted
        clock(step, {})
    assert mode == ["warn", 0]
    assert clock.sync_warnings == ["called a synchronizing CUDA operation (step 2)", "called a synchronizing CUDA operation (step 3)"]
    assert StepClock(torch.device("cpu"), 1, 2, 0, sync_debug=True).sync_warnings is None  # n/a on the CPU


def test_a_single_gpu_host_says_the_multi_gpu_path_was_not_exercised():
    from taser.gpu_check.report import multi_gpu_note

    one = {"setups": [{"world_size": 1}], "device": "cuda:0", "visible_gpus": 1, "job": {"ddp_processes": None}}
    assert "was not exercised: this host shows 1 GPU" in multi_gpu_note(one)
    assert multi_gpu_note({**one, "setups": [{"world_size": 1}, {"world_size": 8}], "visible_gpus": 8}) == ""
    assert "ddp_processes=0" in multi_gpu_note({**one, "visible_gpus": 8, "job": {"ddp_processes": 0}})


def test_failures_name_the_run_and_what_is_wrong():
    check = {"passed": True}
    assert run_failures("1 GPU", {"model": "dpr", "size": "tiny", "check": check, "train": {"steps_per_s": 2.0}}) == []
    [nan] = run_failures("1 GPU", {"model": "dpr", "size": "tiny", "check": check, "train": {"steps_per_s": float("nan")}})
    assert nan == "1 GPU, dpr / tiny: non-finite figure(s): train.steps_per_s"
    [error] = run_failures("1 GPU", {"model": "taser", "size": "bert-base", "error": "FloatingPointError: loss is nan at step 1"})
    assert error == "1 GPU, taser / bert-base: FloatingPointError: loss is nan at step 1"
    mismatch = {"passed": False, "device_loss": 2.5, "reference_loss": 2.0, "precision": "bf16", "relative_difference": 0.25, "tolerance": 0.05}
    [text] = run_failures("1 GPU", {"model": "dpr", "size": "minilm", "check": mismatch})
    assert "loss mismatch: 2.500000 on the device (bf16) vs 2.000000 on the CPU (fp32)" in text and "> tolerance 0.05" in text


def test_config_composes_and_precision_is_left_to_the_hardware():
    register_schema()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        job = typed(compose(config_name="gpu_check"))
        dry = typed(compose(config_name="gpu_check", overrides=["scale=dry_run"]))
    assert isinstance(job, GpuCheckJob) and job.precision == Precision.auto and dry.precision == Precision.auto
    assert job.sizes == [Size.minilm, Size.bert_base] and job.models == ["dpr", "taser"] and job.device == "auto"
    assert dry.device == "cpu" and dry.sizes == [Size.tiny] and dry.passages == 64
    with pytest.raises(ValueError, match="ddp_processes"):
        GpuCheckJob(ddp_processes=1)


def _finite_positive(figures: dict, keys) -> None:
    for key in keys:
        assert isinstance(figures[key], float) and math.isfinite(figures[key]) and figures[key] > 0, (key, figures)


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.slow
def test_dry_run_through_the_library(tmp_path, one_thread):
    from taser.runtime import resolve_precision

    results = run_gpu_check(GpuCheckJob(out_dir=str(tmp_path), **DRY))
    written = json.loads((tmp_path / "results.json").read_text())
    assert results["passed"] and written["passed"] and written["failures"] == []
    expected = resolve_precision("auto", "cpu")  # what this CPU trains in: bf16 where it is native, else fp32
    assert written["precision"] == expected and written["precision_requested"] == "auto" and written["hardware"]["device"] == "cpu"
    [setup] = written["setups"]
    assert [(r["model"], r["size"]) for r in setup["runs"]] == [("dpr", "tiny"), ("taser", "tiny")]
    for run in setup["runs"]:
        assert "error" not in run
        check = run["check"]
        assert check["passed"] and check["precision"] == expected and check["relative_difference"] <= check["tolerance"]
        assert math.isfinite(check["device_loss"]) and check["device_loss"] > 0
        _finite_positive(run["train"], ("steps_per_s", "questions_per_s", "peak_memory_gb", "step_s"))
        assert run["train"]["gpu_busy"] is None and run["train"]["memory_kind"] == "peak RSS"  # n/a on the CPU
        _finite_positive(run["encode"], ("passages_per_s", "questions_per_s"))
        assert run["encode"]["passages"] == 32 and run["parameters"] > 0
    features = {f["feature"]: f for f in setup["features"]}
    assert list(features) == ["gradient caching", "gradient accumulation", "compiled training", "learned token routing", "resume", "reader training"]
    assert features["compiled training"]["skipped"].startswith("CPU dry run")
    assert all(f["passed"] for name, f in features.items() if name != "compiled training"), setup["features"]
    text = (tmp_path / "results.md").read_text()
    assert "| resume | passed |" in text and "| compiled training | skipped |" in text
    assert text.startswith("# GPU check: PASSED") and "| dpr | tiny |" in text and "| taser | tiny |" in text
    assert f"**{expected}**" in text and "n/a" in text and written["machine"] in text
    if peers_installed():
        _finite_positive(setup["peers"]["tiny"], ("passages_per_s", "questions_per_s"))
        assert "sentence-transformers" in text and setup["peers_note"] is None
    else:
        assert "not installed" in setup["peers_note"] and "not installed" in text


@pytest.mark.rehearsal
@pytest.mark.slow
def test_script_on_two_processes_fails_on_a_loss_mismatch(tmp_path):
    """One script run covers the all-GPU path (torchrun, 2 CPU processes) and the exit status: the
    reference is perturbed, so both passes must report a mismatch, with the true figures beside it."""
    out = tmp_path / "out"
    cmd = [sys.executable, str(ROOT / "scripts" / "gpu_check.py"), *DRY_OVERRIDES, f"out_dir={out}", "models=[dpr]", "ddp_processes=2",
           "check.perturb_reference=0.5"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, env=ONE_THREAD)
    assert proc.returncode != 0, proc.stderr[-3000:]
    assert "GPU check FAILED" in proc.stderr and "loss mismatch" in proc.stderr
    written = json.loads((out / "results.json").read_text())
    assert not written["passed"] and len(written["failures"]) == 2, written["failures"]
    single, ddp = written["setups"]
    assert single["world_size"] == 1 and ddp["world_size"] == 2 and "torchrun" in ddp["name"]
    for setup in (single, ddp):
        [run] = setup["runs"]
        assert "error" not in run, run
        check = run["check"]
        assert not check["passed"]
        # without the forced 1.5x, the device loss equals the CPU's (fp32 both sides; 2 ranks = one process on the whole batch)
        assert check["device_loss"] == pytest.approx(check["reference_loss"] / 1.5, rel=1e-4)
        _finite_positive(run["train"], ("steps_per_s", "questions_per_s", "peak_memory_gb"))
    assert ddp["runs"][0]["train"]["questions_per_s"] == pytest.approx(2 * 4 * ddp["runs"][0]["train"]["steps_per_s"])
    text = (out / "results.md").read_text()
    assert text.startswith("# GPU check: FAILED") and "**MISMATCH**" in text and "## Failures" in text and "2 CPU processes" in text


@pytest.mark.slow
def test_the_cpu_reference_leaves_the_measuring_process_malloc_alone(tmp_path):
    """Item 9 of issue 44: the CPU reference trained in the process that then measures the GPU, and
    its `keep_freed_memory` (process-wide) changed that process and its record."""
    script = f"""
import json
from pathlib import Path
from taser.gpu_check.data import prepare_data
from taser.gpu_check.job import GpuCheckJob, Size
from taser.gpu_check.probe import reference_loss
from taser.gpu_check.sizes import model_source
from taser.runtime import freed_memory_kept, hardware
import ctypes
calls, real_cdll = [], ctypes.CDLL
class Libc:  # glibc with its mallopt calls recorded (and not made)
    def __init__(self, *args, **kwargs):
        self._lib = real_cdll(*args, **kwargs)
    def __getattr__(self, name):
        return (lambda *args: calls.append(args) or 1) if name == "mallopt" else getattr(self._lib, name)
ctypes.CDLL = Libc
job = GpuCheckJob(out_dir={str(tmp_path)!r}, **{DRY!r})
work = Path({str(tmp_path)!r})
data = prepare_data(job.squad_json, work, job.passages, job.questions, job.articles)
loss = reference_loss(job, "dpr", Size.tiny, model_source(Size.tiny, work, 0), data.train_file, 1, work)
print(json.dumps({{"loss": loss, "kept": freed_memory_kept(), "recorded": hardware("cpu")["freed_memory_kept"], "mallopt": calls}}))
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=600, env=ONE_THREAD)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert math.isfinite(result["loss"]) and result["kept"] is False and result["recorded"] is False and result["mallopt"] == []


def test_a_training_path_that_disagrees_fails_the_check(tmp_path, monkeypatch):
    """The other training paths judged on their figures: gradient caching's first loss off by 10%,
    a resume that repeats other losses, both failures named in the check's failures."""
    import taser.gpu_check.features as features
    import taser.pipeline.reader as reader
    from taser.gpu_check.check import _collect_failures

    def history(job, settings, train_file, device, precision, out, steps=features.STEPS, stop_after=None, **train):
        name = Path(out).name
        if name == "feature-resumed" and not train.get("resume"):
            raise features._Stop
        if name == "feature-resumed":
            return [9.0, 9.0]  # not the uninterrupted run's steps 3-4
        first = 1.1 if name == "feature-grad-cache" else 1.0
        return [first] + [1.0] * (steps - 1)

    monkeypatch.setattr(features, "_history", history)
    monkeypatch.setattr(reader, "train_reader", lambda job: type("R", (), {"history": [{"loss": 2.0}] * features.STEPS})())
    job = GpuCheckJob(out_dir=str(tmp_path), **DRY)
    train_file = tmp_path / "train.json"
    train_file.write_text(json.dumps([{"question": "q", "answers": ["a"], "positive_ctxs": [{"title": "t", "text": "a b"}], "negative_ctxs": []}]))
    checks = {c["feature"]: c for c in features.feature_checks(job, "unused", Size.tiny, str(train_file), torch.device("cpu"), "fp32", "fp32",
                                                                tmp_path)}
    assert not checks["gradient caching"]["passed"] and checks["gradient accumulation"]["passed"]
    assert not checks["resume"]["passed"] and checks["learned token routing"]["passed"] and checks["reader training"]["passed"]
    failures = _collect_failures({"setups": [{"name": "CPU", "runs": [], "features": list(checks.values())}]})
    assert [f.split(":")[0] for f in failures] == ["CPU, gradient caching", "CPU, resume"]
