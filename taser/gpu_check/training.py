"""Training on one device, measured: the first step's loss (for the check against the CPU), and a
short run's step rate, peak memory and GPU utilisation. Every figure comes from the library's own
`Trainer`, as a user's run would train.

GPU utilisation is the share of wall time in which the GPU runs something: over a few profiled
steps (`torch.profiler`, CUDA activity), the union of the kernels' (and copies') intervals,
overlapping streams counted once, divided by the wall time of those steps.
"""

from __future__ import annotations

import gc
import logging
import resource
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from taser.data.biencoder_json import BiEncoderJsonFile
from taser.models.loading import load_model
from taser.models.params import parameter_report
from taser.training.config import TrainConfig
from taser.training.distributed import DistInfo
from taser.training.trainer import Trainer

log = logging.getLogger(__name__)


@dataclass
class TrainFigures:
    steps: int  # steps run (warm, timed, profiled, and a last one that saves)
    timed_steps: int
    step_s: float  # mean over the timed steps
    steps_per_s: float
    questions_per_s: float  # all ranks' questions per second
    peak_memory_gb: float
    memory_kind: str  # "max_memory_allocated" (CUDA) or "peak RSS" (CPU: this process's, since it started)
    gpu_busy: float | None  # share of profiled wall time the GPU was busy; None on CPU (or when the profiler saw no kernels)
    last_loss: float
    sync_warnings: int | None = None  # implicit host-device syncs in the timed steps (sync_debug=true on a GPU), else None
    sync_sites: list[str] | None = None  # the first few warnings' messages

    def as_dict(self) -> dict:
        return asdict(self)


def busy_share(intervals: list[tuple[float, float]], wall: float) -> float:
    """Length of the union of (start, end) `intervals` over `wall` (same unit)."""
    busy, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if start > end:
            busy += stop - start
            end = stop
        elif stop > end:
            busy += stop - end
            end = stop
    return busy / wall if wall > 0 else float("nan")


def device_intervals(events) -> list[tuple[float, float]]:
    """(start, end) in microseconds of each event that ran on a CUDA device (kernels, copies, sets)."""
    from torch.autograd import DeviceType

    return [(e.time_range.start, e.time_range.end) for e in events if getattr(e, "device_type", None) == DeviceType.CUDA]


class StepClock:
    """The Trainer's `on_step`: the times at the edges of the timed window (steps warm+1 .. warm+timed)
    and of the profiled one, waiting there (only there: the trainer overlaps a step's host work with
    the GPU's work on the previous one) for the GPU to finish; and the profiler's step marks.
    Profiling skips the warm and timed steps, warms up one, records `active`."""

    def __init__(self, device: torch.device, warm: int, timed: int, active: int, sync_debug: bool = False):
        self.device, self.warm, self.timed = device, warm, timed
        self.sync_debug = sync_debug and device.type == "cuda"
        self.sync_warnings: list[str] | None = [] if self.sync_debug else None
        self._catcher = None
        self.skip, self.active = warm + timed, active
        self.edges = {warm, warm + timed} | ({self.skip + 1, self.skip + 1 + active} if active else set())
        self.ends: dict[int, float] = {}  # step -> when it ended, the GPU's work done
        self.resumed: dict[int, float] = {}  # step -> after its profiler mark (starting or stopping a trace takes time of its own)
        self.gpu_busy: float | None = None
        self.profiler = None
        if device.type == "cuda" and active > 0:
            from torch.profiler import ProfilerActivity, profile, schedule

            self.profiler = profile(activities=[ProfilerActivity.CUDA], schedule=schedule(wait=self.skip, warmup=1, active=active, repeat=1),
                                    on_trace_ready=self._trace_ready)

    def __call__(self, step: int, record: dict) -> None:
        edge = step in self.edges
        if edge:
            if step == self.warm + self.timed:
                self._watch_syncs(False)  # before the edge's own synchronize
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            self.ends[step] = time.perf_counter()
        if self.profiler is not None:
            self.profiler.step()
        if edge:
            if step == self.warm:
                self._watch_syncs(True)
            self.resumed[step] = time.perf_counter()

    def _watch_syncs(self, on: bool) -> None:
        """sync_debug: warn on every implicit host-device sync between the timed window's edges, and count the warnings."""
        if not self.sync_debug:
            return
        if on:
            self._catcher = warnings.catch_warnings(record=True)
            self._caught = self._catcher.__enter__()
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            return
        torch.cuda.set_sync_debug_mode(0)
        if self._catcher is not None:
            self.sync_warnings.extend(str(w.message) for w in self._caught if "synchroniz" in str(w.message))
            self._catcher.__exit__(None, None, None)
            self._catcher = None

    @property
    def timed_seconds(self) -> float:
        """Wall time of the timed steps."""
        return self.ends[self.warm + self.timed] - self.resumed[self.warm]

    def start(self) -> None:
        """Start the profiler; a profiler this machine refuses (no CUPTI access, say) leaves GPU utilisation n/a."""
        if self.profiler is None:
            return
        try:
            self.profiler.start()
        except Exception as e:  # the figure is lost, not the check
            log.warning("torch.profiler did not start (%s: %s): GPU utilisation is reported as n/a", type(e).__name__, e)
            self.profiler = None

    def stop(self) -> None:
        if self.profiler is not None:
            try:
                self.profiler.stop()
            except Exception as e:
                log.warning("torch.profiler did not stop cleanly (%s: %s)", type(e).__name__, e)

    def _trace_ready(self, prof) -> None:
        # recorded: steps skip+2 .. skip+1+active, from after the mark that started the trace (the end of the
        # profiler's warm-up step, skip+1) to the end of the last of them (this mark stops it)
        try:
            wall_us = (self.ends[self.skip + 1 + self.active] - self.resumed[self.skip + 1]) * 1e6
            intervals = device_intervals(prof.events())
        except Exception as e:
            log.warning("could not read the profile (%s: %s): GPU utilisation is reported as n/a", type(e).__name__, e)
            return
        if intervals:
            self.gpu_busy = busy_share(intervals, wall_us)
        else:
            log.warning("the profiler recorded no CUDA activity: GPU utilisation is reported as n/a")


def _train_config(job, batch_size: int, steps: int, precision: str, device: str, warmup: int) -> TrainConfig:
    return TrainConfig(batch_size=batch_size, hard_negatives=job.hard_negatives, other_negatives=0, warmup_steps=warmup, max_steps=steps,
                       precision=precision, device=device, seed=job.seed, log_every=steps, save_every=0, val_max_questions=0,
                       progress=job.progress)


def _load(settings: dict, seed: int):
    """The model of `settings`; anything drawn at random (a learned router) from `seed`, so every process loads the same weights."""
    torch.manual_seed(seed)
    return load_model(settings)


def release(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def first_step_loss(job, settings: dict, train_file: str, device: torch.device, precision: str, batch_size: int, out_dir: Path,
                    dist_info: DistInfo | None = None) -> float:
    """The loss of one optimizer step's batch (computed before the update) with `settings`' initial weights."""
    model, tokenizer = _load(settings, job.seed)
    trainer = Trainer(model, tokenizer, [BiEncoderJsonFile(train_file)], _train_config(job, batch_size, 1, precision, str(device), 0),
                      out_dir, dist_info=dist_info)
    loss = float(trainer.train().history[0]["loss"])
    del trainer, model
    release(device)
    return loss


def peak_memory_gb(device: torch.device) -> tuple[float, str]:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 1e9, "max_memory_allocated"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9, "peak RSS"  # Linux: kilobytes


def measure_training(job, settings: dict, train_file: str, device: torch.device, precision: str, out_dir: Path,
                     dist_info: DistInfo | None = None):
    """(figures, parameters, model, tokenizer) of a short run: warm steps, timed steps, profiled steps
    (GPUs only), then one more (its end-of-run checkpoint stays out of every figure)."""
    dist_info = dist_info or DistInfo()
    profiled = job.profiled_steps if device.type == "cuda" else 0
    skip = job.warm_steps + job.timed_steps
    steps = skip + (1 + profiled if profiled else 0) + 1
    model, tokenizer = _load(settings, job.seed)
    parameters = parameter_report(model)["total"]
    release(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    clock = StepClock(device, job.warm_steps, job.timed_steps, profiled, sync_debug=job.sync_debug)
    trainer = Trainer(model, tokenizer, [BiEncoderJsonFile(train_file)],
                      _train_config(job, job.batch_size, steps, precision, str(device), min(job.warm_steps, 10)), out_dir,
                      dist_info=dist_info, on_step=clock)
    clock.start()
    try:
        result = trainer.train()
    finally:
        clock._watch_syncs(False)  # a run that failed inside the window leaves no warning mode behind
        clock.stop()
    memory, memory_kind = peak_memory_gb(device)
    step_s = clock.timed_seconds / job.timed_steps
    questions = job.batch_size * dist_info.world_size
    figures = TrainFigures(steps=result.steps, timed_steps=job.timed_steps, step_s=step_s, steps_per_s=1.0 / step_s,
                           questions_per_s=questions / step_s, peak_memory_gb=memory, memory_kind=memory_kind, gpu_busy=clock.gpu_busy,
                           last_loss=float(result.history[-1]["loss"]),
                           sync_warnings=None if clock.sync_warnings is None else len(clock.sync_warnings),
                           sync_sites=None if clock.sync_warnings is None else sorted(set(clock.sync_warnings))[:5])
    log.info("trained %d steps: %.2f steps/s, %.1f questions/s, peak %.2f GB (%s), GPU busy %s", result.steps, figures.steps_per_s,
             figures.questions_per_s, memory, memory_kind, "n/a" if clock.gpu_busy is None else f"{clock.gpu_busy:.0%}")
    del trainer
    return figures, parameters, model, tokenizer
