"""The reader's training batches, one per optimizer step, fixed by (seed, step) alone: a resumed
run sees the same batches as an uninterrupted one, mid-epoch included.

Each epoch visits the questions in a seeded order; rank r of w takes its slice of each step's
questions. Per question (DPR's `_create_question_passages_tensors`): one positive drawn among its
positives, then m - 1 negatives drawn among its negatives (fewer when it has fewer: the row is
padded and masked); the positive comes first.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from taser.reader.data import TrainQuestion
from taser.reader.inputs import answer_spans, answer_token_ids, encode_passages, pad_passages


@dataclass
class ReaderBatch:
    input_ids: torch.Tensor  # [N, M, L]
    attention_mask: torch.Tensor  # [N, M, L]
    passage_mask: torch.Tensor  # [N, M]
    starts: torch.Tensor  # [N, A]
    ends: torch.Tensor  # [N, A]
    span_mask: torch.Tensor  # [N, A]

    def to(self, device) -> ReaderBatch:
        return ReaderBatch(*(t.to(device, non_blocking=True) for t in vars(self).values()))


class StepSampler:
    def __init__(self, questions: list[TrainQuestion], tokenizer, batch_size: int, passages: int, max_answers: int,
                 max_length: int, max_question_length: int, seed: int, rank: int = 0, world_size: int = 1):
        self.questions, self.tokenizer = questions, tokenizer
        self.batch_size, self.passages, self.max_answers = batch_size, passages, max_answers
        self.max_length, self.max_question_length = max_length, max_question_length
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.steps_per_epoch = len(questions) // (batch_size * world_size)
        if self.steps_per_epoch < 1:
            raise ValueError(f"{len(questions)} training questions make no step of {batch_size} x {world_size} questions")

    def question_indexes(self, step: int) -> list[int]:
        epoch, within = divmod(step, self.steps_per_epoch)
        order = np.random.default_rng([self.seed, epoch]).permutation(len(self.questions))
        first = (within * self.world_size + self.rank) * self.batch_size
        return order[first : first + self.batch_size].tolist()

    def _sample(self, step: int, index: int) -> tuple[list[dict], TrainQuestion]:
        q = self.questions[index]
        rng = np.random.default_rng([self.seed, step, index])
        positive = q.positives[int(rng.integers(len(q.positives)))]
        take = min(self.passages - 1, len(q.negatives))
        negatives = [q.negatives[int(i)] for i in rng.permutation(len(q.negatives))[:take]]
        return [positive, *negatives], q

    def batch(self, step: int) -> ReaderBatch:
        rows, spans = [], []
        for index in self.question_indexes(step):
            ctxs, q = self._sample(step, index)
            inputs = encode_passages(self.tokenizer, q.question, ctxs, self.max_length, self.max_question_length)
            found = answer_spans(inputs[0], answer_token_ids(self.tokenizer, q.answers), self.max_answers)
            if not found:  # the training set keeps only positives with a span
                raise AssertionError(f"no answer span in the positive passage of {q.question!r}")
            rows.append(inputs)
            spans.append(found)
        ids, mask, present = pad_passages(rows, self.tokenizer.pad_token_id or 0)
        width = max(len(s) for s in spans)
        starts = torch.zeros((len(rows), width), dtype=torch.long)
        ends = torch.zeros((len(rows), width), dtype=torch.long)
        span_mask = torch.zeros((len(rows), width), dtype=torch.bool)
        for i, found in enumerate(spans):
            for j, (s, e) in enumerate(found):
                starts[i, j], ends[i, j], span_mask[i, j] = s, e, True
        return ReaderBatch(ids, mask, present, starts, ends, span_mask)


class Prefetcher:
    """`sampler.batch(step)`, with the next step's batch tokenised in a background thread while the
    current step trains (the tokenizer releases the GIL): the training thread waits only for what the
    background one has not finished. Batches depend on (seed, step) alone, so the result is the same."""

    def __init__(self, sampler: StepSampler, total_steps: int):
        self.sampler, self.total_steps = sampler, total_steps
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="reader-batches")
        self._next: tuple[int, Future] | None = None

    def batch(self, step: int) -> ReaderBatch:
        if self._next is not None and self._next[0] == step:
            batch = self._next[1].result()
        else:
            batch = self.sampler.batch(step)
        self._next = (step + 1, self._pool.submit(self.sampler.batch, step + 1)) if step + 1 < self.total_steps else None
        return batch

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
