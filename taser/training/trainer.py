"""The training loop: batches, optimisation, logging, validation, checkpoints and resume."""

from __future__ import annotations

import json
import logging
import math
import random
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch
from safetensors.torch import load_file
from tqdm.auto import tqdm

from taser.data.batching import collate, example_rng, make_example
from taser.io import atomic_open
from taser.runtime import describe_hardware, grad_scaler, pick_device, precision_record
from taser.training.checkpoint import has_checkpoint, load_training_state, save_checkpoint
from taser.training.config import TrainConfig
from taser.training.distributed import DistInfo, all_reduce_gradients, all_reduce_sum
from taser.training.lr_decay import param_groups
from taser.training.sampler import MultiSetSchedule
from taser.training.step import StepRunner
from taser.training.validation import validate

log = logging.getLogger(__name__)


def linear_schedule(optimizer, warmup: int, total: int):
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / (warmup + 1)
        return max(0.0, (total - step) / max(1, total - warmup))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def _truncate_log(path: Path, step: int) -> None:
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
        self.model, self.tokenizer, self.train_sets, self.cfg = model, tokenizer, list(train_sets), cfg
        self.dev_set, self.out = dev_set, Path(output_dir)
        self.dist = dist_info or DistInfo()
        self.on_step = on_step
        self.device = pick_device(cfg.device)
        self.runtime = precision_record(cfg.precision, self.device)
        if self.dist.is_main:
            log.info("training in %s (precision=%s) on %s", self.runtime["precision"], cfg.precision, describe_hardware(self.device))
        if cfg.grad_accumulation < 1 or cfg.batch_size < 1:
            raise ValueError("batch_size and grad_accumulation must be >= 1")
        # one schedule batch = one optimizer step: every rank's micro-batches of that step
        step_batch = cfg.batch_size * self.dist.world_size * cfg.grad_accumulation
        self.schedule = MultiSetSchedule([len(s) for s in self.train_sets], step_batch, cfg.seed, cfg.sampling_rates)
        self.total_steps = cfg.max_steps if cfg.max_steps is not None else cfg.epochs * self.schedule.batches_per_epoch
        if self.total_steps < 1:
            raise ValueError(f"nothing to train: {self.schedule.batches_per_epoch} batches per epoch, max_steps {cfg.max_steps}")
        self._epoch_cache: tuple[int, list] | None = None

    # -- data --------------------------------------------------------------------------
    def _micro_batch(self, step: int, micro: int):
        """This rank's share of micro-batch `micro` of optimizer step `step` (0-based)."""
        epoch, position = divmod(step, self.schedule.batches_per_epoch)
        if self._epoch_cache is None or self._epoch_cache[0] != epoch:
            self._epoch_cache = (epoch, self.schedule.epoch(epoch))
        batch = self._epoch_cache[1][position]
        b = self.cfg.batch_size
        start = (micro * self.dist.world_size + self.dist.rank) * b
        mine = batch[start : start + b]
        examples = [
            make_example(self.train_sets[d][i], self.cfg.hard_negatives, self.cfg.other_negatives, example_rng(self.cfg.seed, epoch, d, i))
            for d, i in mine
        ]
        return collate(examples, self.tokenizer, self.model.config.max_question_length, self.model.config.max_length).to(self.device)

    # -- loop --------------------------------------------------------------------------
    def train(self) -> TrainResult:
        cfg, model = self.cfg, self.model
        random.seed(cfg.seed + self.dist.rank)
        np.random.seed(cfg.seed + self.dist.rank)
        torch.manual_seed(cfg.seed + self.dist.rank)
        model.to(self.device).train()
        # the fused kernel: one pass over all parameters (6x faster than the default loop on CPU)
        optimizer = torch.optim.AdamW(param_groups(model, cfg.learning_rate, cfg.weight_decay, cfg.layer_decay), lr=cfg.learning_rate, eps=cfg.adam_eps, fused=self.device.type in ("cpu", "cuda"))
        scheduler = linear_schedule(optimizer, cfg.warmup_steps, self.total_steps)
        precision = self.runtime["precision"]
        scaler = grad_scaler(precision, self.device)
        runner = StepRunner(model, cfg.loss_config(model.config), precision, self.device, cfg.grad_cache_chunk, self.dist.world_size)
        ckpt_dir = self.out / "checkpoint"
        step = 0
        if cfg.resume and has_checkpoint(ckpt_dir):
            model.load_state_dict(load_file(str(ckpt_dir / "model.safetensors")))
            step = load_training_state(ckpt_dir, optimizer, scheduler, scaler, self.dist.rank)["step"]
            log.info("resumed from %s at step %d of %d", ckpt_dir, step, self.total_steps)
        elif cfg.resume:
            log.info("train.resume=true but no checkpoint in %s: starting from scratch", ckpt_dir)

        history: list[dict] = []
        log_path = self.out / "train_log.jsonl"
        if self.dist.is_main:
            _truncate_log(log_path, step)
        global_q = cfg.batch_size * self.dist.world_size
        bar = tqdm(total=self.total_steps, initial=step, desc="train", disable=not (cfg.progress and self.dist.is_main), mininterval=2)
        start, window_start, window_steps, step_times = time.perf_counter(), time.perf_counter(), 0, []
        params = [p for p in model.parameters() if p.requires_grad]
        while step < self.total_steps:
            t0 = time.perf_counter()
            loss_sum, correct, aux = 0.0, 0, {}
            for micro in range(cfg.grad_accumulation):
                batch = self._micro_batch(step, micro)
                stats = runner.run(batch, global_q, self.dist.rank * cfg.batch_size, scale=1.0 / cfg.grad_accumulation, scaler=scaler)
                loss_sum += stats.loss_sum
                correct += stats.correct
                for k, v in stats.aux.items():
                    aux[k] = aux.get(k, 0.0) + v / cfg.grad_accumulation
            all_reduce_gradients(params)
            if scaler is not None:
                scaler.unscale_(optimizer)
            grad_norm = float(torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)) if cfg.grad_clip > 0 else float("nan")
            if scaler is not None:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            step_times.append(time.perf_counter() - t0)
            window_steps += 1
            bar.update(1)
            n_q = global_q * cfg.grad_accumulation
            record = {"step": step, "loss": all_reduce_sum(loss_sum) / n_q, "acc": all_reduce_sum(correct) / n_q, "lr": scheduler.get_last_lr()[0], "grad_norm": grad_norm, "precision": precision, **{f"aux_{k}": v for k, v in aux.items()}}
            if not math.isfinite(record["loss"]):
                raise FloatingPointError(f"loss is {record['loss']} at step {step}; lower train.learning_rate or check the data")
            if step % max(cfg.log_every, 1) == 0 or step == self.total_steps:
                elapsed = time.perf_counter() - window_start
                record["questions_per_s"] = window_steps * n_q / max(elapsed, 1e-9)
                window_start, window_steps = time.perf_counter(), 0
                if self.dist.is_main:
                    log.info("step %d/%d loss %.4f acc %.3f lr %.2e %.1f q/s", step, self.total_steps, record["loss"], record["acc"], record["lr"], record["questions_per_s"])
            if self.dev_set is not None and ((cfg.eval_every and step % cfg.eval_every == 0) or step == self.total_steps):
                if self.dist.is_main:
                    record.update(validate(model, self.tokenizer, self.dev_set, replace(cfg, precision=precision), self.device))
                    log.info("step %d validation %s", step, {k: round(v, 4) for k, v in record.items() if k.startswith("val_")})
            history.append(record)
            if self.dist.is_main:
                with open(log_path, "a", encoding="utf-8") as f:
                    f.write(json.dumps(record) + "\n")
            if (cfg.save_every and step % cfg.save_every == 0) or step == self.total_steps:
                save_checkpoint(ckpt_dir, model, self.tokenizer, optimizer, scheduler, scaler, step, self.dist.is_main, extra={"runtime": self.runtime})
            if self.on_step is not None:
                self.on_step(step, record)
        bar.close()
        seconds = time.perf_counter() - start
        median_step = float(np.median(step_times)) if step_times else None
        final = self.out / "final"
        if self.dist.is_main:
            model.save(final, self.tokenizer)
            with atomic_open(self.out / "train_summary.json") as f:
                json.dump({"steps": step, "seconds": seconds, "median_step_s": median_step, "config": asdict(cfg), "runtime": self.runtime, "last": history[-1] if history else {}}, f, indent=2)
        return TrainResult(step, str(final), seconds, median_step if median_step is not None else float("nan"), history, step_times)
