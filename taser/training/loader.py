"""Training batches built off the training thread: a DataLoader over optimizer steps.

Item k of `StepBatches` is this rank's micro-batches of optimizer step `first_step + k`:
records sampled, tokenised and collated on the CPU. Every item depends only on (seed, step,
micro-batch, rank), never on the items before it, so worker processes can build them in any
order while the DataLoader hands them out in step order, and a run resumed at step s starts its
loader at s and sees exactly the batches an uninterrupted run would.

With workers (`train.loader_workers`, by default some on a GPU and none on a CPU, where the
encoders already use every core), batches are built while the device computes, and with
`pin_memory` their host-to-device copies run asynchronously.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch
from torch.utils.data import DataLoader, Dataset

from taser.training.batching import Batch, collate, example_rng, gold_negatives, make_example
from taser.training.sampler import MultiSetSchedule


class StepBatches(Dataset):
    def __init__(self, train_sets: Sequence, schedule: MultiSetSchedule, tokenizer, *, seed: int, batch_size: int, grad_accumulation: int,
                 hard_negatives: int, other_negatives: int, max_question_length: int, max_length: int, rank: int = 0, world_size: int = 1,
                 first_step: int = 0, total_steps: int, gold_negatives: int = 0):
        self.train_sets, self.schedule, self.tokenizer = list(train_sets), schedule, tokenizer
        self.seed, self.batch_size, self.grad_accumulation = seed, batch_size, grad_accumulation
        self.hard_negatives, self.other_negatives, self.gold_negatives = hard_negatives, other_negatives, gold_negatives
        self.max_question_length, self.max_length = max_question_length, max_length
        self.rank, self.world_size = rank, world_size
        self.first_step, self.total_steps = first_step, total_steps
        self._epoch_cache: tuple[int, list] | None = None

    def __len__(self) -> int:
        return max(0, self.total_steps - self.first_step)

    def __getitem__(self, k: int) -> list[Batch]:
        if not 0 <= k < len(self):
            raise IndexError(k)
        step = self.first_step + k
        return [self.micro_batch(step, micro) for micro in range(self.grad_accumulation)]

    def micro_batch(self, step: int, micro: int) -> Batch:
        """This rank's share of micro-batch `micro` of optimizer step `step` (0-based)."""
        epoch, position = divmod(step, self.schedule.batches_per_epoch)
        if self._epoch_cache is None or self._epoch_cache[0] != epoch:
            self._epoch_cache = (epoch, self.schedule.epoch(epoch))
        batch = self._epoch_cache[1][position]
        start = (micro * self.world_size + self.rank) * self.batch_size
        examples = [
            make_example(self.train_sets[d][i], self.hard_negatives, self.other_negatives, example_rng(self.seed, epoch, d, i),
                         gold_negatives(self.train_sets[d], i, self.gold_negatives, self.seed, d))
            for d, i in batch[start : start + self.batch_size]
        ]
        return collate(examples, self.tokenizer, self.max_question_length, self.max_length)


def default_loader_workers(device: torch.device, local_world_size: int = 1) -> int:
    """`train.loader_workers=null`: none on a CPU (the encoders use every core; batch building
    measured 0.3-0.5% of a CPU step), else up to 4 per process from the cores it can spare."""
    if device.type == "cpu":
        return 0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(0, min(4, cores // max(1, local_world_size) - 1))


def _quiet_worker(_worker_id: int) -> None:
    # a fast tokenizer's own thread pool is not fork-safe, and the workers run in parallel already
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    torch.set_num_threads(1)


def step_loader(dataset: StepBatches, workers: int, pin_memory: bool) -> DataLoader:
    """The steps of `dataset` in order, built by `workers` processes (0: on this thread)."""
    return DataLoader(
        dataset,
        batch_size=None,  # every item is already one step's micro-batches
        shuffle=False,
        num_workers=workers,
        pin_memory=pin_memory,
        prefetch_factor=2 if workers else None,
        worker_init_fn=_quiet_worker if workers else None,
        # its own generator: the loader draws a seed when iterated, which must not advance the
        # global random state that a resumed run restores (dropout would then differ)
        generator=torch.Generator().manual_seed(0),
    )
