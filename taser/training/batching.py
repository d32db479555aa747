"""From bi-encoder records to training batches.

Each question takes its first positive (DPR's default), `hard_negatives` passages from
`hard_negative_ctxs` (falling back to `negative_ctxs` when it has none) and `other_negatives`
from `negative_ctxs`, both drawn by a generator seeded from (seed, epoch, dataset, record), so
a resumed run draws exactly what an uninterrupted one would.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from taser.models.inputs import tokenize_passages, tokenize_questions


@dataclass
class Example:
    question: str
    passages: list[dict]  # the positive first, then this question's negatives


def make_example(record: dict, hard_negatives: int, other_negatives: int, rng: random.Random) -> Example:
    hard_pool = record.get("hard_negative_ctxs") or record.get("negative_ctxs") or []
    other_pool = record.get("negative_ctxs") or []
    hard = rng.sample(hard_pool, min(hard_negatives, len(hard_pool)))
    other = rng.sample(other_pool, min(other_negatives, len(other_pool)))
    return Example(record["question"], [record["positive_ctxs"][0], *hard, *other])


def example_rng(seed: int, epoch: int, dataset: int, index: int) -> random.Random:
    return random.Random(f"{seed}:{epoch}:{dataset}:{index}")


@dataclass
class Batch:
    questions: dict[str, torch.Tensor]
    passages: dict[str, torch.Tensor]
    positive_idx: torch.Tensor  # [B] row of each question's positive in the passages
    ctx_owner: torch.Tensor  # [N] index of the question each passage belongs to

    def to(self, device) -> Batch:
        move = lambda d: {k: v.to(device, non_blocking=True) for k, v in d.items()}  # noqa: E731
        return Batch(move(self.questions), move(self.passages), self.positive_idx.to(device), self.ctx_owner.to(device))

    @property
    def size(self) -> int:
        return len(self.positive_idx)


def collate(examples: Sequence[Example], tokenizer, max_question_length: int, max_length: int) -> Batch:
    questions = tokenize_questions(tokenizer, [e.question for e in examples], max_question_length)
    ctxs = [c for e in examples for c in e.passages]
    passages = tokenize_passages(tokenizer, [c.get("title", "") or "" for c in ctxs], [c["text"] for c in ctxs], max_length)
    starts, owner, pos = [], [], 0
    for i, e in enumerate(examples):
        starts.append(pos)
        owner.extend([i] * len(e.passages))
        pos += len(e.passages)
    return Batch(questions, passages, torch.tensor(starts), torch.tensor(owner))
