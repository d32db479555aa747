"""The training loop: batches, optimisation, logging, validation, checkpoints and resume."""

from __future__ import annotations

import json
import logging
import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

from taser.io import atomic_open
from taser.models.taser_config import TaserConfig
from taser.progress import progress
from taser.runtime import describe_hardware, grad_scaler, launcher_local_rank, pick_device, training_record
from taser.training.checkpoint import agreed_checkpoint, load_training_state, save_checkpoint
from taser.training.config import TrainConfig
from taser.training.distributed import DistInfo, data_parallel
from taser.training.grad_norms import clip_gradients
from taser.training.loader import StepBatches, default_loader_workers, step_loader
from taser.training.lr_decay import param_groups
from taser.training.records import NonFiniteLosses, PendingStep, read_steps
from taser.training.sampler import MultiSetSchedule
from taser.training.step import StepRunner
from taser.training.subset import fixed_subset
from taser.training.tensorboard import TensorBoardLog
from taser.training.validation import validate

log = logging.getLogger(__name__)


def linear_schedule(optimizer, warmup: int, total: int):
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / (warmup + 1)
        return max(0.0, (total - step) / max(1, total - warmup))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def truncate_log(path: Path, step: int) -> None:
    """Keep the log lines of steps up to `step` (those after a checkpoint are redone on resume)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        return
    kept = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line)["step"] <= step]
    with atomic_open(path) as f:
        f.writelines(line + "\n" for line in kept)


@dataclass
class TrainResult:
    steps: int
    final_dir: str
    seconds: float
    seconds_per_step: float  # median
    history: list[dict]
    step_seconds: list[float]
    compile: dict | None = None  # train.compile: shapes, graphs, cache hits and misses (taser.training.compiled)


@dataclass
class _Loop:
    """What the loop's steps share."""

    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    scaler: torch.amp.GradScaler | None
    runner: StepRunner
    params: list[tuple[str, torch.nn.Parameter]]  # the trained ones, by name
    precision: str
    nonfinite: NonFiniteLosses = field(default_factory=NonFiniteLosses)  # fp16: non-finite losses in a row
    history: list[dict] = field(default_factory=list)
    step_times: list[float] = field(default_factory=list)
    pending: list[PendingStep] = field(default_factory=list)  # steps whose figures are still on the device
    window_start: float = field(default_factory=time.perf_counter)


class Trainer:
    """Trains a BiEncoder on bi-encoder JSON files (several = DPR's multi-set)."""

    def __init__(
        self,
        model,
        tokenizer,
        train_sets: Sequence,
        cfg: TrainConfig,
        output_dir: str | Path,
        dev_set=None,
        dist_info: DistInfo | None = None,
        on_step: Callable[[int, dict], None] | None = None,
    ):
        self.model, self.tokenizer, self.cfg = model, tokenizer, cfg
        self.train_sets = fixed_subset(list(train_sets), cfg.train_questions, cfg.train_subset, cfg.seed)
        self.dev_set, self.out = dev_set, Path(output_dir)
        self.dist = dist_info or DistInfo()
        self.on_step = on_step
        self.device = pick_device(cfg.device)
        self.runtime = training_record(cfg.precision, self.device)
        if self.dist.is_main:
            hw = self.runtime["hardware"]
            log.info("training in %s (precision=%s) on %s; huge-page tensors %s, freed memory kept %s", self.runtime["precision"],
                     cfg.precision, describe_hardware(self.device), hw["huge_page_tensors"], hw["freed_memory_kept"])
        # one schedule batch = one optimizer step: every rank's micro-batches of that step
        step_batch = cfg.batch_size * self.dist.world_size * cfg.grad_accumulation
        self.schedule = MultiSetSchedule([len(s) for s in self.train_sets], step_batch, cfg.seed, cfg.sampling_rates)
        self.total_steps = cfg.max_steps if cfg.max_steps is not None else cfg.epochs * self.schedule.batches_per_epoch
        if self.total_steps < 1:
            raise ValueError(f"nothing to train: {self.schedule.batches_per_epoch} batches per epoch, max_steps {cfg.max_steps}")
        if cfg.warmup_steps >= self.total_steps and self.dist.is_main:
            log.warning("train.warmup_steps=%d is not shorter than the run (%d steps): the learning rate never reaches train.learning_rate=%g "
                        "(at most %.2fx of it); shorten the warm-up or train longer", cfg.warmup_steps, self.total_steps, cfg.learning_rate,
                        self.total_steps / (cfg.warmup_steps + 1))
        self._curves: TensorBoardLog | None = None
        self._compiled = None  # taser.training.compiled.CompiledEncoding under train.compile
        if cfg.compile:
            self._check_compilable()

    # -- compiled steps (train.compile) ---------------------------------------------------
    def _check_compilable(self) -> None:
        """What the settings alone could not tell (TrainConfig refused the rest before loading)."""
        from taser.training.compile_plan import model_refusal

        config = self.model.config
        learned = config.kind.specialised and TaserConfig.from_dict(config.taser).learned
        refusal = model_refusal(self.model.unpad, learned, self.device.type, _has_triton())
        if refusal:
            raise ValueError(refusal)

    def _compile(self):
        """The compiled encoder pass: its buckets from the model's lengths, its cache directory."""
        from taser.training.compile_plan import bucket_lengths, resolve_cache_dir
        from taser.training.compiled import CompiledEncoding

        cfg, config = self.cfg, self.model.config
        compiled = CompiledEncoding(bucket_lengths(config.max_question_length, cfg.compile_buckets), bucket_lengths(config.max_length, cfg.compile_buckets),
                                    cfg.batch_size * (1 + cfg.hard_negatives + cfg.other_negatives + cfg.gold_negatives),
                                    _pad_token_id(self.tokenizer, self.model),
                                    resolve_cache_dir(cfg.compile_cache_dir))
        if self.dist.is_main:
            log.info("train.compile: encoders compiled by torch.compile (inductor, static shapes), inputs padded to lengths %s (questions) and %s "
                     "(passages), %d passage rows; compiler caches in %s%s", compiled.buckets["question"], compiled.buckets["passage"],
                     compiled.passage_rows, compiled.cache_dir, " (training steps run padded; validation as model.unpad says)"
                     if self.model.unpad is None and self.device.type == "cpu" else "")
        return compiled

    # -- data --------------------------------------------------------------------------
    def _loader(self, first_step: int):
        """This rank's micro-batches of every step from `first_step` on, built by the loader's
        workers (`train.loader_workers`; by default some on a GPU, none on a CPU)."""
        cfg, config = self.cfg, self.model.config
        dataset = StepBatches(self.train_sets, self.schedule, self.tokenizer, seed=cfg.seed, batch_size=cfg.batch_size,
                              grad_accumulation=cfg.grad_accumulation, hard_negatives=cfg.hard_negatives, other_negatives=cfg.other_negatives,
                              max_question_length=config.max_question_length, max_length=config.max_length, rank=self.dist.rank,
                              world_size=self.dist.world_size, first_step=first_step, total_steps=self.total_steps,
                              gold_negatives=cfg.gold_negatives)
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1")) if launcher_local_rank() is not None else 1
        workers = cfg.loader_workers if cfg.loader_workers is not None else default_loader_workers(self.device, local_world)
        return step_loader(dataset, workers, pin_memory=self.device.type == "cuda")

    # -- the loop: named steps ---------------------------------------------------------
    def train(self) -> TrainResult:
        loop = self._set_up()
        step = self._resume(loop)
        self._open_log(step)
        batches = iter(self._loader(step))
        bar = progress(total=self.total_steps, initial=step, desc="train", unit="step", enabled=self.cfg.progress and self.dist.is_main)
        start = loop.window_start = time.perf_counter()
        try:
            while step < self.total_steps:
                t0 = time.perf_counter()
                loop.pending.append(self._optimizer_step(loop, step, next(batches)))
                step += 1
                loop.step_times.append(time.perf_counter() - t0)
                bar.update(1)
                if self._read_due(step):
                    self._read(loop, step)
                self._save(loop, step)
                if self.on_step is not None:
                    self.on_step(step, loop.pending[-1].record if loop.pending else loop.history[-1])
            bar.close()
            return self._finish(loop, step, time.perf_counter() - start)
        finally:
            if self._curves is not None:
                self._curves.close()
                self._curves = None

    def _set_up(self) -> _Loop:
        """Seeds, the model on its device, optimizer, schedule, gradient scaler and step runner."""
        cfg, model = self.cfg, self.model
        random.seed(cfg.seed + self.dist.rank)
        np.random.seed(cfg.seed + self.dist.rank)
        torch.manual_seed(cfg.seed + self.dist.rank)
        model.to(self.device).train()
        groups = param_groups(model, cfg.learning_rate, cfg.weight_decay, cfg.layer_decay)
        # the fused kernel: one pass over all parameters (6x faster than the default loop on CPU)
        optimizer = torch.optim.AdamW(groups, lr=cfg.learning_rate, eps=cfg.adam_eps, fused=self.device.type in ("cpu", "cuda"))
        precision = self.runtime["precision"]
        trained = data_parallel(model, find_unused_parameters=self._may_leave_parameters_idle())
        if cfg.compile:
            self._compiled = self._compile()
        return _Loop(
            optimizer=optimizer,
            scheduler=linear_schedule(optimizer, cfg.warmup_steps, self.total_steps),
            scaler=grad_scaler(precision, self.device),
            runner=StepRunner(trained, cfg.loss_config(model.config), precision, self.device, cfg.grad_cache_chunk, self.dist.world_size,
                              compiled=self._compiled),
            params=[(n, p) for n, p in model.named_parameters() if p.requires_grad],
            precision=precision,
            nonfinite=NonFiniteLosses(cfg.max_nonfinite_losses),
        )

    def _resume(self, loop: _Loop) -> int:
        """The step to start from: 0, or the checkpoint's when `resume` is set and one exists."""
        ckpt_dir = agreed_checkpoint(self.out / "checkpoint", self.cfg.resume)  # collective: the ranks decide together
        if ckpt_dir is None:
            return 0
        self.model.load_state_dict(load_file(str(ckpt_dir / "model.safetensors")))
        step = load_training_state(ckpt_dir, loop.optimizer, loop.scheduler, loop.scaler, self.dist.rank)["step"]
        log.info("resumed from %s at step %d of %d", ckpt_dir, step, self.total_steps)
        return step

    def _open_log(self, step: int) -> None:
        """`train_log.jsonl` cut back to `step`; TensorBoard's writer (`train.tensorboard`), which
        drops events after `step` left by a killed run."""
        if self.dist.is_main:
            truncate_log(self.out / "train_log.jsonl", step)
            if self.cfg.tensorboard:
                self._curves = TensorBoardLog(self.out, step)

    def _may_leave_parameters_idle(self) -> bool:
        """Whether a forward pass can leave a trained parameter without a gradient, which DDP
        must then look for after every pass (a walk of the graph): an expert that learned
        routing sent no input to, or one encoder in a gradient-cache chunk of the other side.
        (The encoders' pooler, which no vector uses, is frozen, so it never counts.)"""
        config = self.model.config
        learned = config.kind.specialised and TaserConfig.from_dict(config.taser).learned
        return bool(learned or self.cfg.grad_cache_chunk)

    def _optimizer_step(self, loop: _Loop, step: int, micro_batches) -> PendingStep:
        """Forward and backward of every micro-batch, gradients summed over ranks, clipped, applied.
        Nothing is read back from the device: the figures stay in the returned PendingStep."""
        cfg = self.cfg
        global_q = cfg.batch_size * self.dist.world_size
        loss_sum = correct = 0
        aux: dict[str, torch.Tensor] = {}
        for micro, batch in enumerate(micro_batches):
            stats = loop.runner.run(batch.to(self.device), global_q, self.dist.rank * cfg.batch_size,
                                    scale=1.0 / cfg.grad_accumulation, scaler=loop.scaler, sync=micro == cfg.grad_accumulation - 1)
            loss_sum = loss_sum + stats.loss_sum
            correct = correct + stats.correct
            for k, v in stats.aux.items():
                aux[k] = aux.get(k, 0.0) + v / cfg.grad_accumulation
        if loop.scaler is not None:
            loop.scaler.unscale_(loop.optimizer)
        # always measured: with a scaler the norm tells an overflow; without one, a non-finite norm must stop the run before a save
        norms = clip_gradients(loop.params, cfg.grad_clip if cfg.grad_clip > 0 else float("inf"))
        if loop.scaler is not None:
            loop.scaler.step(loop.optimizer)  # skipped when the gradients overflowed
            loop.scaler.update()
        else:
            loop.optimizer.step()
        lr = loop.scheduler.get_last_lr()[0]  # the rate this step applied (after `step()` it is the next step's)
        loop.scheduler.step()
        loop.optimizer.zero_grad(set_to_none=True)
        return PendingStep({"step": step + 1, "lr": lr, "precision": loop.precision}, loss_sum, correct,
                           norms.total if norms is not None else None, aux, norms)

    def _read_due(self, step: int) -> bool:
        """Steps whose figures are read: every `log_every`, before validation and checkpoints (the
        log on disk then holds every step a resumed run keeps), and the last."""
        cfg = self.cfg
        return (step % cfg.log_every == 0 or step == self.total_steps or bool(cfg.eval_every and step % cfg.eval_every == 0)
                or bool(cfg.save_every and step % cfg.save_every == 0))

    def _read(self, loop: _Loop, step: int) -> None:
        """The pending steps' figures, read at once; the last one gets the throughput since the
        last read and, when due, validation; each is written to the training log."""
        n_q = self.cfg.batch_size * self.dist.world_size * self.cfg.grad_accumulation
        records = read_steps(loop.pending, n_q, skips_overflow=loop.scaler is not None, nonfinite=loop.nonfinite)
        loop.pending = []
        last = records[-1]
        elapsed = time.perf_counter() - loop.window_start
        last["questions_per_s"] = len(records) * n_q / max(elapsed, 1e-9)
        loop.window_start = time.perf_counter()
        if self.dist.is_main:
            log.info("step %d/%d loss %.4f acc %.3f lr %.2e %.1f q/s", step, self.total_steps, last["loss"], last["acc"], last["lr"],
                     last["questions_per_s"])
        self._validate(last)
        for record in records:
            self._write_record(loop, record)

    def _validate(self, record: dict) -> None:
        """Every `eval_every` steps and at the end, on the main rank: validation metrics into `record`."""
        step = record["step"]
        due = (self.cfg.eval_every and step % self.cfg.eval_every == 0) or step == self.total_steps
        if self.dev_set is None or not due or not self.dist.is_main:
            return
        record.update(validate(self.model, self.tokenizer, self.dev_set, replace(self.cfg, precision=self.runtime["precision"]), self.device))
        log.info("step %d validation %s", step, {k: round(v, 4) for k, v in record.items() if k.startswith("val_")})

    def _write_record(self, loop: _Loop, record: dict) -> None:
        loop.history.append(record)
        if self.dist.is_main:
            with open(self.out / "train_log.jsonl", "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")
            if self._curves is not None:
                self._curves.write(record)

    def _save(self, loop: _Loop, step: int) -> None:
        """Every `save_every` steps and at the end: the resumable checkpoint (every rank takes part)."""
        if (self.cfg.save_every and step % self.cfg.save_every == 0) or step == self.total_steps:
            save_checkpoint(self.out / "checkpoint", self.model, self.tokenizer, loop.optimizer, loop.scheduler, loop.scaler, step,
                            self.dist.is_main, extra={"runtime": self.runtime})

    def _finish(self, loop: _Loop, step: int, seconds: float) -> TrainResult:
        """The final model directory and `train_summary.json` (main rank)."""
        median_step = float(np.median(loop.step_times)) if loop.step_times else None
        final = self.out / "final"
        compiled = self._compiled.log_report() if self._compiled is not None and self.dist.is_main else None
        if self.dist.is_main:
            self.model.save(final, self.tokenizer)
            summary = {"steps": step, "seconds": seconds, "median_step_s": median_step, "config": asdict(self.cfg), "runtime": self.runtime,
                       "last": loop.history[-1] if loop.history else {}}
            if compiled is not None:
                summary["compile"] = compiled
            with atomic_open(self.out / "train_summary.json") as f:
                json.dump(summary, f, indent=2)
        return TrainResult(step, str(final), seconds, median_step if median_step is not None else float("nan"), loop.history, loop.step_times,
                           compiled)


def _has_triton() -> bool:
    import importlib.util

    return importlib.util.find_spec("triton") is not None


def _pad_token_id(tokenizer, model) -> int:
    """The padding id of bucketed inputs (masked out: any id would do; the tokenizer's is the natural one)."""
    pad = getattr(tokenizer, "pad_token_id", None)
    if pad is None:
        pad = getattr(model.encoder_config, "pad_token_id", None)
    return int(pad or 0)
