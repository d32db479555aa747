"""Encode many questions or passages: batches sorted by length, padded to their longest.

Questions and passages are tokenised as DPR and TASER do (`taser.models.inputs`): questions
normalised, titled passages as (title, text) pairs truncated longest-first.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence

import numpy as np
import torch

from taser.models.inputs import pad_batch, passage_ids, question_ids
from taser.progress import progress as progress_bar
from taser.runtime import autocast, precision_record, resolve_precision

log = logging.getLogger(__name__)

SIDES = ("question", "passage")


CPU_BATCH = 64


def auto_batch_size(model, device: torch.device, max_length: int) -> int:
    """A batch that fits the device: 64 on a CPU (larger batches measured no faster there); on a
    GPU, a power of two between 16 and 1024 whose inference activations (one layer's hidden,
    intermediate and attention-score tensors, live at once) take at most half the free memory."""
    if device.type != "cuda":
        return CPU_BATCH
    cfg = model.encoder_config
    free, _ = torch.cuda.mem_get_info(device)
    per_sequence = 4 * max_length * (8 * cfg.hidden_size + cfg.intermediate_size + 2 * cfg.num_attention_heads * max_length)
    fits = max(1, int(0.5 * free // max(per_sequence, 1)))
    return int(min(1024, max(16, 2 ** int(math.log2(fits)))))


@torch.no_grad()
def encode_ids(
    model,
    tokenizer,
    ids: Sequence[Sequence[int]],
    side: str,
    batch_size: int | None = None,
    precision: str = "auto",
    device: torch.device | None = None,
    progress: bool = False,
    bar=None,
) -> np.ndarray:
    """float32 vectors of token-id rows in their order, encoded longest first in batches padded to
    the longest member, so padding (and wasted compute) is minimal. `batch_size=None`: one that
    fits the device (`auto_batch_size`).

    The vectors stay on the device until the last batch, and inputs go to a GPU from pinned
    memory without waiting, so the host builds the next batch while the device computes the
    current one (one sync per call, not one per batch).

    `progress`: a bar (with ETA) of its own; `bar`: a caller's bar to advance instead (a stage
    that encodes in chunks shows one bar for all of them).
    """
    if side not in SIDES:
        raise ValueError(f"side must be one of {', '.join(SIDES)}, got {side!r}")
    device = device or device_of(model)
    precision = resolve_precision(precision, device)
    longest = max((len(x) for x in ids), default=0)
    batch_size = batch_size or auto_batch_size(model, device, max(longest, 1))
    pinned = device.type == "cuda"
    was_training = model.training
    model.eval()
    start = time.perf_counter()
    order = np.argsort([-len(x) for x in ids], kind="stable")
    out = torch.zeros((len(ids), model.encoder_config.hidden_size), dtype=torch.float32, device=device)
    own = bar is None
    if own:
        bar = progress_bar(total=len(ids), desc=f"encode {side}s", unit=side, enabled=progress)
    try:
        for b in range(0, len(order), batch_size):
            rows = order[b : b + batch_size]
            batch = pad_batch([ids[i] for i in rows], tokenizer.pad_token_id)
            if pinned:
                batch = {k: v.pin_memory() for k, v in batch.items()}
            inputs = {k: v.to(device, non_blocking=pinned) for k, v in batch.items()}
            with autocast(precision, device):
                vecs = model.encode(inputs["input_ids"], inputs["attention_mask"], side)
            out.index_copy_(0, torch.from_numpy(rows).to(device, non_blocking=pinned), vecs.float())
            bar.update(len(rows))
        vectors = out.cpu().numpy()
    finally:
        if own:
            bar.close()
        model.train(was_training)
    elapsed = time.perf_counter() - start
    if len(ids):
        log.info("encoded %d %ss in %.1fs (%.1f/s, %s, batch %d)", len(ids), side, elapsed, len(ids) / max(elapsed, 1e-9), precision, batch_size)
    return vectors


def device_of(model) -> torch.device:
    """Where `model` computes: its parameters' device (a `BiEncoder`), or its `device` (an ONNX Runtime encoder)."""
    device = getattr(model, "device", None)
    return device if isinstance(device, torch.device) else next(model.parameters()).device


def encoding_runtime(model, precision: str) -> dict:
    """The runtime record of an encoding (precision resolved for the device, the hardware) with its
    backend: a CPU engine's graph runs in its own precision (`taser.models.backends.ENGINE_PRECISION`), whatever `precision` says."""
    from taser.models.backends import ENGINE_PRECISION

    backend = getattr(model, "backend", "torch")
    runtime = precision_record(precision, device_of(model))
    if backend != "torch":
        runtime["precision"] = ENGINE_PRECISION[backend]
    return {**runtime, "backend": backend}


def _max_length(model, side: str) -> int:
    return model.config.max_question_length if side == "question" else model.config.max_length


def encode_texts(model, tokenizer, texts: Sequence, side: str, **kwargs) -> np.ndarray:
    """float32 vectors of `texts` in their order. Questions are strings; passages are
    `(title, text)` pairs (or single strings, tokenised as they are, e.g. `passage_string`s)."""
    max_length = _max_length(model, side)
    texts = list(texts)
    if side == "question":
        ids = question_ids(tokenizer, texts, max_length)
    elif texts and not isinstance(texts[0], str):
        ids = passage_ids(tokenizer, [t for t, _ in texts], [x for _, x in texts], max_length)
    else:
        ids = tokenizer(texts, truncation=True, max_length=max_length)["input_ids"] if texts else []
    return encode_ids(model, tokenizer, ids, side, **kwargs)


def encode_passages(model, tokenizer, passages, **kwargs) -> np.ndarray:
    """Vectors of `Passage`s (anything with `.title` and `.text`), as DPR and TASER tokenise them."""
    passages = list(passages)
    ids = passage_ids(tokenizer, [p.title for p in passages], [p.text for p in passages], model.config.max_length)
    return encode_ids(model, tokenizer, ids, "passage", **kwargs)


def encode_questions(model, tokenizer, questions: Sequence[str], **kwargs) -> np.ndarray:
    """Vectors of questions, normalised as DPR does (’ -> ') before tokenising."""
    return encode_texts(model, tokenizer, questions, "question", **kwargs)
