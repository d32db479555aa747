"""Training the reader: the retriever trainer's pieces (AdamW groups, linear warm-up and decay,
precision from the hardware with its autocast and gradient scaler, DDP with summed gradients,
device-side step records, resumable checkpoints) around DPR's reader objective.

A checkpoint (`output_dir/checkpoint`) holds the reader and the training state; the batches are
fixed by (seed, step) (`taser.reader.batches`), so a resumed run ends with the weights of an
uninterrupted one. The last weights go to `output_dir/final`, a reader checkpoint directory; with
dev questions, the weights of the best dev EM go to `output_dir/best` (`taser.reader.selection`).
"""

from __future__ import annotations

import json
import logging
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

from taser.io import atomic_open
from taser.progress import progress
from taser.reader.batches import Prefetcher, StepSampler
from taser.reader.config import ReaderTrainConfig
from taser.reader.data import TrainingSet
from taser.reader.loss import reader_loss
from taser.reader.model import Reader
from taser.reader.optim import reader_param_groups
from taser.reader.selection import DevSelection
from taser.runtime import autocast, describe_hardware, grad_scaler, pick_device, training_record
from taser.training.checkpoint import agreed_checkpoint, load_training_state, save_checkpoint
from taser.training.distributed import DistInfo, data_parallel
from taser.training.grad_norms import clip_gradients
from taser.training.records import NonFiniteLosses, PendingStep, read_steps
from taser.training.trainer import linear_schedule, truncate_log

log = logging.getLogger(__name__)


@dataclass
class ReaderTrainResult:
    steps: int
    final_dir: str
    seconds: float
    seconds_per_step: float  # median
    history: list[dict]


class ReaderTrainer:
    def __init__(self, model: Reader, tokenizer, data: TrainingSet, cfg: ReaderTrainConfig, output_dir, dist_info: DistInfo | None = None,
                 dev: DevSelection | None = None):
        self.model, self.tokenizer, self.data, self.cfg, self.dev = model, tokenizer, data, cfg, dev
        self.out = Path(output_dir)
        self.dist = dist_info or DistInfo()
        self.device = pick_device(cfg.device)
        self.runtime = training_record(cfg.precision, self.device)
        self.precision = self.runtime["precision"]
        mc = model.config
        self.sampler = StepSampler(data.questions, tokenizer, cfg.batch_size, cfg.passages, cfg.max_answers, mc.max_length,
                                   mc.max_question_length, cfg.seed, self.dist.rank, self.dist.world_size)
        self.total_steps = cfg.max_steps if cfg.max_steps is not None else cfg.epochs * self.sampler.steps_per_epoch

    def train(self) -> ReaderTrainResult:
        cfg, model = self.cfg, self.model
        if self.dist.is_main:
            log.info("training the reader in %s (precision=%s) on %s: %d questions, %d steps", self.precision, cfg.precision,
                     describe_hardware(self.device), len(self.data.questions), self.total_steps)
        random.seed(cfg.seed + self.dist.rank)
        np.random.seed(cfg.seed + self.dist.rank)
        torch.manual_seed(cfg.seed + self.dist.rank)
        model.to(self.device).train()
        optimizer = torch.optim.AdamW(reader_param_groups(model, cfg.learning_rate, cfg.weight_decay, cfg.head_learning_rate),
                                      lr=cfg.learning_rate, eps=cfg.adam_eps, fused=self.device.type in ("cpu", "cuda"))
        names = [g["name"] for g in optimizer.param_groups]
        self.encoder_group, self.head_group = names.index("encoder"), names.index("heads") if "heads" in names else None
        scheduler = linear_schedule(optimizer, cfg.warmup_steps, self.total_steps)
        scaler = grad_scaler(self.precision, self.device)
        trained = data_parallel(model, find_unused_parameters=False)
        step = self._resume(optimizer, scheduler, scaler)
        if self.dist.is_main:
            truncate_log(self.out / "train_log.jsonl", step)
            if self.dev is not None:
                self.dev.resume(step)
        history, pending, times = [], [], []
        params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        nonfinite = NonFiniteLosses(cfg.max_nonfinite_losses)
        bar = progress(total=self.total_steps, initial=step, desc="train reader", unit="step", enabled=cfg.progress and self.dist.is_main)
        start = window = time.perf_counter()
        self.batches = Prefetcher(self.sampler, self.total_steps)  # the next step's batch tokenised off the training thread
        try:
            step = self._loop(step, trained, params, optimizer, scheduler, scaler, history, pending, times, nonfinite, bar, window)
        finally:
            self.batches.close()
        bar.close()
        return self._finish(step, time.perf_counter() - start, history, times)

    def _loop(self, step, trained, params, optimizer, scheduler, scaler, history, pending, times, nonfinite, bar, window) -> int:
        cfg, model = self.cfg, self.model
        while step < self.total_steps:
            t0 = time.perf_counter()
            pending.append(self._step(trained, params, optimizer, scheduler, scaler, step))
            step += 1
            times.append(time.perf_counter() - t0)
            bar.update(1)
            last = step == self.total_steps
            evaluates = self.dev is not None and (bool(cfg.eval_every and step % cfg.eval_every == 0) or last)
            saves = bool(cfg.save_every and step % cfg.save_every == 0) or last
            if step % cfg.log_every == 0 or last or saves or evaluates:  # every step is read before anything of it is written
                records = read_steps(pending, cfg.batch_size * self.dist.world_size, skips_overflow=scaler is not None, nonfinite=nonfinite)
                pending = []
                records[-1]["questions_per_s"] = len(records) * cfg.batch_size * self.dist.world_size / max(time.perf_counter() - window, 1e-9)
                window = time.perf_counter()
                self._write(records, history)
            if evaluates:
                # every rank reads its share of the dev questions; before the checkpoint of this step: a run killed in
                # between evaluates this step again when resumed
                self.dev.evaluate(step, model, self.tokenizer, self.precision, self.device, self.dist)
            if saves:
                save_checkpoint(self.out / "checkpoint", model, self.tokenizer, optimizer, scheduler, scaler, step, self.dist.is_main,
                                extra={"runtime": self.runtime})
        return step

    def _resume(self, optimizer, scheduler, scaler) -> int:
        ckpt = agreed_checkpoint(self.out / "checkpoint", self.cfg.resume)  # collective: the ranks decide together
        if ckpt is None:
            return 0
        self.model.load_state_dict(load_file(str(ckpt / "model.safetensors")))
        step = load_training_state(ckpt, optimizer, scheduler, scaler, self.dist.rank)["step"]
        log.info("resumed the reader from %s at step %d of %d", ckpt, step, self.total_steps)
        return step

    def _step(self, trained, params, optimizer, scheduler, scaler, step: int) -> PendingStep:
        batch = self.batches.batch(step).to(self.device)
        with autocast(self.precision, self.device):
            out = trained(batch.input_ids, batch.attention_mask)
        loss, span, selection, correct = reader_loss(out.start_logits, out.end_logits, out.relevance_logits, batch.attention_mask,
                                                     batch.passage_mask, batch.starts, batch.ends, batch.span_mask)
        (scaler.scale(loss) if scaler is not None else loss).backward()
        if scaler is not None:
            scaler.unscale_(optimizer)
        # always measured: a non-finite norm skips an fp16 step, and stops an fp32/bf16 run before its checkpoint
        norms = clip_gradients(params, self.cfg.grad_clip if self.cfg.grad_clip > 0 else float("inf"))
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        rates = scheduler.get_last_lr()
        lr = rates[self.encoder_group]
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        n = len(batch.input_ids)
        aux = {"span_loss": span / n, "selection_loss": selection / n}  # per question, this rank's
        record = {"step": step + 1, "lr": lr, "precision": self.precision}
        if self.head_group is not None:
            record["head_lr"] = rates[self.head_group]
        return PendingStep(record, loss.detach(), correct,
                           norms.total if norms is not None else None, aux, norms)

    def _write(self, records: list[dict], history: list[dict]) -> None:
        last = records[-1]
        if self.dist.is_main:
            log.info("step %d/%d loss %.4f (span %.4f, selection %.4f) selection acc %.3f lr %.2e %.1f q/s", last["step"], self.total_steps,
                     last["loss"], last["aux_span_loss"], last["aux_selection_loss"], last["acc"], last["lr"], last["questions_per_s"])
        for record in records:
            history.append(record)
            if self.dist.is_main:
                with open(self.out / "train_log.jsonl", "a", encoding="utf-8") as f:
                    f.write(json.dumps(record) + "\n")

    def _finish(self, step: int, seconds: float, history: list[dict], times: list[float]) -> ReaderTrainResult:
        median = float(np.median(times)) if times else float("nan")
        final = self.out / "final"
        if self.dist.is_main:
            self.model.save(final, self.tokenizer)
            summary = {"steps": step, "seconds": seconds, "median_step_s": median, "config": asdict(self.cfg),
                       "model": asdict(self.model.config), "runtime": self.runtime,
                       "questions": len(self.data.questions), "gold_positives": self.data.gold_positives, "skipped": self.data.skipped,
                       "last": history[-1] if history else {}, "dev_best": self.dev.best if self.dev is not None else None}
            with atomic_open(self.out / "train_summary.json") as f:
                json.dump(summary, f, indent=2, default=str)
        return ReaderTrainResult(step, str(final), seconds, median, history)
