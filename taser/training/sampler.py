"""Which records make each batch: DPR's multi-set schedule, reproducible from (seed, epoch).

Every dataset contributes `rate * len(dataset)` records per epoch (rate < 1 subsamples,
rate > 1 repeats), cut into batches of one dataset each (so in-batch negatives come from the
same source, as in DPR's multi-set training); the batches of all datasets are then shuffled.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class MultiSetSchedule:
    def __init__(self, sizes: Sequence[int], batch_size: int, seed: int, rates: Sequence[float] | None = None):
        rates = list(rates) if rates is not None else [1.0] * len(sizes)
        if len(rates) != len(sizes):
            raise ValueError(f"{len(sizes)} training files but {len(rates)} sampling rates")
        if any(r <= 0 for r in rates):
            raise ValueError(f"sampling rates must be > 0, got {rates}")
        self.sizes, self.rates, self.batch_size, self.seed = list(sizes), rates, batch_size, seed
        self.per_dataset = [int(round(n * r)) // batch_size for n, r in zip(sizes, rates)]
        if sum(self.per_dataset) == 0:
            raise ValueError(f"no full batch of {batch_size} fits in the training data (sizes {sizes}, rates {rates})")

    @property
    def batches_per_epoch(self) -> int:
        return sum(self.per_dataset)

    def epoch(self, epoch: int) -> list[list[tuple[int, int]]]:
        """The epoch's batches, each a list of (dataset, record index)."""
        rng = np.random.default_rng([self.seed, epoch])
        batches = []
        for d, (n, rate, nb) in enumerate(zip(self.sizes, self.rates, self.per_dataset)):
            reps = int(np.ceil(rate))
            order = np.concatenate([rng.permutation(n) for _ in range(reps)])[: nb * self.batch_size]
            batches += [[(d, int(i)) for i in order[b * self.batch_size : (b + 1) * self.batch_size]] for b in range(nb)]
        return [batches[i] for i in rng.permutation(len(batches))]
