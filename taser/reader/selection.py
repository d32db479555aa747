"""Choosing the reader's checkpoint on dev questions, as DPR does: every `train.dev_every` steps
(and at the end) the reader answers the dev retrieval's questions from their first
`train.dev_passages` passages; the weights with the highest exact match so far are kept in
`output_dir/best` (a reader checkpoint directory, like `final`), and every evaluation is a line of
`output_dir/dev_log.jsonl` (`{"step", "em", "f1", "questions"}`).

Under torchrun every rank answers its share of the dev questions (every world_size-th, from its
rank on) and the sums are added over the ranks: the figures are the one-process figures, in a
world_size-th of the time, and no rank waits idle in a collective while rank 0 reads them all.

A resumed run drops the lines written after its checkpoint and takes the best so far from the
lines kept: a run stopped and resumed keeps the `best` an uninterrupted run keeps.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from taser.reader.model import Reader
from taser.reader.reading import predict, read_passages
from taser.training.distributed import DistInfo, all_reduce_sum

log = logging.getLogger(__name__)

DEV_LOG = "dev_log.jsonl"
BEST_DIR = "best"


class DevSelection:
    def __init__(self, records: list[dict], passages: int, match: str, max_answer_length: int, batch_size: int, out_dir):
        self.records, self.passages, self.match = records, passages, match
        self.max_answer_length, self.batch_size = max_answer_length, batch_size
        self.out = Path(out_dir)
        self.best: dict | None = None  # {"step", "em", "f1", "questions"}

    @property
    def log_path(self) -> Path:
        return self.out / DEV_LOG

    def resume(self, step: int) -> None:
        """Keep the evaluations of steps up to `step` (those of the checkpoint resumed from); the best among them."""
        kept = []
        if self.log_path.is_file():
            kept = [r for r in (json.loads(line) for line in self.log_path.read_text(encoding="utf-8").splitlines() if line.strip()) if r["step"] <= step]
            self.log_path.write_text("".join(json.dumps(r) + "\n" for r in kept), encoding="utf-8")
        self.best = max(kept, key=lambda r: r["em"], default=None)  # the earliest of equal scores, as during training

    @torch.no_grad()
    def score(self, model: Reader, tokenizer, precision: str, device: torch.device, dist_info: DistInfo | None = None) -> tuple[float, float]:
        """(EM, F1) in % of the dev questions, each answered from its first `passages` passages;
        under torchrun each rank answers its share and the sums are added over the ranks."""
        dist_info = dist_info or DistInfo()
        mine = self.records[dist_info.rank :: dist_info.world_size]
        was_training = model.training
        read = read_passages(model, tokenizer, mine, self.passages, self.max_answer_length, self.batch_size, precision, device,
                             show_progress=False) if mine else []
        model.train(was_training)
        em = f1 = 0.0
        for record, passages in zip(mine, read):
            prediction = predict(record, passages, self.passages, self.match)
            em, f1 = em + prediction["em"], f1 + prediction["f1"]
        em, f1 = all_reduce_sum(torch.tensor([em, f1], dtype=torch.float64, device=device)).tolist()
        n = len(self.records)
        return 100 * em / n, 100 * f1 / n

    def evaluate(self, step: int, model: Reader, tokenizer, precision: str, device: torch.device, dist_info: DistInfo | None = None) -> dict:
        """Score the model at `step` (every rank takes part), log it, and, on the main rank, save it
        as `best` when its EM beats every earlier one."""
        dist_info = dist_info or DistInfo()
        em, f1 = self.score(model, tokenizer, precision, device, dist_info)
        record = {"step": step, "em": em, "f1": f1, "questions": len(self.records)}
        if not dist_info.is_main:
            return record
        with open(self.log_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        improved = self.best is None or em > self.best["em"]
        if improved:
            model.save(self.out / BEST_DIR, tokenizer)
            self.best = record
        log.info("dev at step %d: EM %.2f F1 %.2f over %d questions%s", step, em, f1, len(self.records),
                 " (best so far: saved)" if improved else f" (best: EM {self.best['em']:.2f} at step {self.best['step']})")
        return record
