"""From bi-encoder records to training batches.

Each question takes its first positive (DPR's default), `hard_negatives` passages from
`hard_negative_ctxs` (falling back to `negative_ctxs` when it has none) and `other_negatives`
from `negative_ctxs`, both drawn by a generator seeded from (seed, epoch, dataset, record), so
a resumed run draws exactly what an uninterrupted one would; then `gold_negatives`: the first
positives of other records of its training set (DPR Table 3's "Gold" negatives), drawn once per
(seed, dataset, record), so a question keeps the same ones at every epoch, and never a passage
equal to one of its own positives (same `passage_id` where both have one, else the same text).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from taser.data.passages import same_passage
from taser.models.inputs import tokenize_passages, tokenize_questions


@dataclass
class Example:
    question: str
    passages: list[dict]  # the positive first, then this question's negatives


def make_example(record: dict, hard_negatives: int, other_negatives: int, rng: random.Random, gold: Sequence[dict] = ()) -> Example:
    """`gold`: this question's gold negatives (`gold_negatives`), after its sampled ones."""
    hard_pool = record.get("hard_negative_ctxs") or record.get("negative_ctxs") or []
    other_pool = record.get("negative_ctxs") or []
    hard = rng.sample(hard_pool, min(hard_negatives, len(hard_pool)))
    other = rng.sample(other_pool, min(other_negatives, len(other_pool)))
    return Example(record["question"], [record["positive_ctxs"][0], *hard, *other, *gold])


def example_rng(seed: int, epoch: int, dataset: int, index: int) -> random.Random:
    return random.Random(f"{seed}:{epoch}:{dataset}:{index}")


def gold_negatives(records: Sequence[dict], index: int, count: int, seed: int, dataset: int) -> list[dict]:
    """`count` first positives of other records of `records` for record `index`: drawn once per
    (seed, dataset, record), none equal to one of the record's own positives or to each other.
    Fewer when the set has too few distinct other positives (a bounded number of draws)."""
    if count == 0:
        return []
    own = records[index]["positive_ctxs"]
    rng = random.Random(f"gold:{seed}:{dataset}:{index}")
    chosen: list[dict] = []
    tried: set[int] = {index}
    for _ in range(20 * count):
        if len(chosen) == count or len(tried) >= len(records):
            break
        j = rng.randrange(len(records))
        if j in tried:
            continue
        tried.add(j)
        candidate = records[j]["positive_ctxs"][0]
        if not any(same_passage(candidate, p) for p in (*own, *chosen)):
            chosen.append(candidate)
    return chosen


@dataclass
class Batch:
    """One (micro-)batch. The lengths are host-side integers wherever the tensors go, so chunking
    and trimming never read a device tensor back (a host sync on a GPU)."""

    questions: dict[str, torch.Tensor]  # input_ids and attention_mask, right-padded to the longest
    passages: dict[str, torch.Tensor]
    positive_idx: torch.Tensor  # [B] row of each question's positive in the passages
    ctx_owner: torch.Tensor  # [N] index of the question each passage belongs to
    question_lengths: list[int]  # real tokens per question
    passage_lengths: list[int]  # real tokens per passage

    def _map(self, fn) -> Batch:
        return Batch({k: fn(v) for k, v in self.questions.items()}, {k: fn(v) for k, v in self.passages.items()}, fn(self.positive_idx),
                     fn(self.ctx_owner), self.question_lengths, self.passage_lengths)

    def to(self, device) -> Batch:
        return self._map(lambda t: t.to(device, non_blocking=True))

    def pin_memory(self) -> Batch:
        """Page-locked copies (what the DataLoader's pin_memory calls), so `to` copies asynchronously."""
        return self._map(lambda t: t.pin_memory())

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
    return Batch(questions, passages, torch.tensor(starts), torch.tensor(owner),
                 questions["attention_mask"].sum(1).tolist(), passages["attention_mask"].sum(1).tolist())
