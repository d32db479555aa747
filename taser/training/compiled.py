"""Compiled training steps (`train.compile=true`): the encoders' padded pass through
`torch.compile` (inductor, static shapes), on batches bucketed to a few shapes.

Each side's inputs are padded (columns) up to the next of a few lengths
(`taser.training.compile_plan.bucket_lengths`), and the passages (rows) up to the step's full
count, questions x (1 + hard + other negatives): a question short of negatives adds masked
dummy rows, whose vectors are dropped before the loss. Every shape a compiled encoder sees is
then (rows, bucket) of its side, so it compiles at most once per bucket, and the graphs go to
inductor's on-disk caches, where the next run with the same settings finds them.

Padding is masked in attention and pooling, so a bucketed step computes the plain step's loss
to float rounding (with dropout, compiled kernels draw their own masks: equal in
distribution). Only the training forward (and its backward) is compiled; validation and
encoding run as before.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.nn.functional as F

from taser.models.unpad import padded_states
from taser.training.batching import Batch
from taser.training.compile_plan import bucket_for

log = logging.getLogger(__name__)

# (counter group, name) of torch's compile counters reported per run
CACHE_COUNTERS = (("inductor", "fxgraph_cache_hit"), ("inductor", "fxgraph_cache_miss"), ("inductor", "fxgraph_cache_bypass"),
                  ("aot_autograd", "autograd_cache_hit"), ("aot_autograd", "autograd_cache_miss"), ("aot_autograd", "autograd_cache_bypass"))


def use_cache_dir(cache_dir: Path) -> None:
    """Inductor's caches (FX graphs, AOT autograd, compiled kernels; Triton's on a GPU, unless
    TRITON_CACHE_DIR says otherwise) under `cache_dir`, switched on."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir)
    os.environ.setdefault("TRITON_CACHE_DIR", str(cache_dir / "triton"))
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    inductor_config.fx_graph_cache = True
    functorch_config.enable_autograd_cache = True


def _counters() -> dict[str, int]:
    from torch._dynamo.utils import counters

    found = {name: counters[group][name] for group, name in CACHE_COUNTERS}
    found["graphs"] = counters["stats"]["unique_graphs"]
    return found


def pad_inputs(inputs: dict[str, torch.Tensor], rows: int, length: int, pad_token_id: int) -> dict[str, torch.Tensor]:
    """`input_ids` and `attention_mask` padded right to `length` columns and down to `rows` rows;
    an added row is one unmasked pad token (a row with no token at all would make attention NaN)."""
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    extra_cols, extra_rows = length - ids.shape[1], rows - ids.shape[0]
    if extra_cols < 0 or extra_rows < 0:
        raise ValueError(f"inputs of shape {tuple(ids.shape)} do not fit the bucket ({rows}, {length})")
    ids = F.pad(ids, (0, extra_cols), value=pad_token_id)
    mask = F.pad(mask, (0, extra_cols), value=0)
    if extra_rows:
        ids = torch.cat([ids, ids.new_full((extra_rows, length), pad_token_id)])
        dummy = mask.new_zeros((extra_rows, length))
        dummy[:, 0] = 1
        mask = torch.cat([mask, dummy])
    return {**inputs, "input_ids": ids, "attention_mask": mask}


class CompiledEncoding:
    """The compiled padded encoder pass, the buckets of each side and what was compiled.

    `backend`: torch.compile's (inductor; tests pass a counting one)."""

    def __init__(self, question_buckets: list[int], passage_buckets: list[int], passage_rows: int, pad_token_id: int, cache_dir: Path,
                 backend="inductor"):
        self.buckets = {"question": list(question_buckets), "passage": list(passage_buckets)}
        self.passage_rows, self.pad_token_id, self.cache_dir = passage_rows, pad_token_id, cache_dir
        use_cache_dir(cache_dir)
        import torch._dynamo.config as dynamo_config

        # one graph per (encoder, shape) on one code object: room for every bucket of both sides
        needed = 2 * (len(question_buckets) + len(passage_buckets))
        dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, needed)
        self.call = torch.compile(padded_states, backend=backend, dynamic=False)
        self.shapes: set[tuple[str, int, int]] = set()  # (side, rows, length) the compiled pass has run
        self._start = _counters()

    def bucket(self, batch: Batch) -> Batch:
        """`batch` with each side padded to its bucket and the passages to the full row count."""
        q_len = bucket_for(max(batch.question_lengths, default=1), self.buckets["question"])
        p_len = bucket_for(max(batch.passage_lengths, default=1), self.buckets["passage"])
        rows = max(self.passage_rows, len(batch.passage_lengths))
        q_rows = len(batch.question_lengths)
        for shape in (("question", q_rows, q_len), ("passage", rows, p_len)):
            if shape not in self.shapes:
                self.shapes.add(shape)
                log.info("compiled training: first %s batch of shape %s: compiling, or reading it from the cache", shape[0], shape[1:])
        return Batch(pad_inputs(batch.questions, q_rows, q_len, self.pad_token_id), pad_inputs(batch.passages, rows, p_len, self.pad_token_id),
                     batch.positive_idx, batch.ctx_owner, batch.question_lengths, batch.passage_lengths)

    @contextmanager
    def active(self, model) -> Iterator[None]:
        """The model's padded encoder pass compiled for the duration (`model` may be DDP-wrapped)."""
        inner = getattr(model, "module", model)
        inner.encoder_call = self.call
        try:
            yield
        finally:
            inner.encoder_call = None

    def report(self) -> dict:
        """What this run compiled: its distinct input shapes, dynamo's new graphs, and the caches'
        hits and misses (a run that found everything cached has hits and no misses)."""
        now = _counters()
        delta = {k: now[k] - self._start[k] for k in now}
        return {"cache_dir": str(self.cache_dir), "buckets": self.buckets, "passage_rows": self.passage_rows,
                "shapes": [list(s) for s in sorted(self.shapes)], **delta}

    def log_report(self) -> dict:
        found = self.report()
        log.info("compiled %d graph(s) for %d distinct input shape(s) %s; FX graph cache %d hit(s) %d miss(es), AOT autograd cache %d hit(s) "
                 "%d miss(es), in %s", found["graphs"], len(found["shapes"]), [tuple(s) for s in found["shapes"]], found["fxgraph_cache_hit"],
                 found["fxgraph_cache_miss"], found["autograd_cache_hit"], found["autograd_cache_miss"], found["cache_dir"])
        return found
