"""Encode many questions or passages: batches sorted by length, padded to their longest."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from taser.models.inputs import passage_string
from taser.runtime import autocast, resolve_precision

log = logging.getLogger(__name__)


@torch.no_grad()
def encode_texts(
    model,
    tokenizer,
    texts: Sequence[str],
    side: str,
    batch_size: int = 64,
    precision: str = "auto",
    device: torch.device | None = None,
    progress: bool = False,
) -> np.ndarray:
    """float32 vectors of `texts` in their order. Passages are given as `passage_string`s.

    Texts are tokenised once, then encoded longest first in batches padded to the longest
    member, so padding (and wasted compute) is minimal.
    """
    device = device or next(model.parameters()).device
    precision = resolve_precision(precision, device)
    max_length = model.config.max_question_length if side == "question" else model.config.max_length
    was_training = model.training
    model.eval()
    start = time.perf_counter()
    ids = tokenizer(list(texts), truncation=True, max_length=max_length, add_special_tokens=True)["input_ids"]
    order = np.argsort([-len(x) for x in ids], kind="stable")
    out = np.zeros((len(texts), model.encoder_config.hidden_size), dtype=np.float32)
    pad = tokenizer.pad_token_id
    bar = tqdm(total=len(texts), desc=f"encode {side}s", unit=side[0], disable=not progress, mininterval=2)
    for b in range(0, len(order), batch_size):
        rows = order[b : b + batch_size]
        longest = max(len(ids[i]) for i in rows)
        input_ids = torch.full((len(rows), longest), pad, dtype=torch.long)
        mask = torch.zeros((len(rows), longest), dtype=torch.long)
        for j, i in enumerate(rows):
            input_ids[j, : len(ids[i])] = torch.tensor(ids[i])
            mask[j, : len(ids[i])] = 1
        with autocast(precision, device):
            vecs = model.encode(input_ids.to(device), mask.to(device), side)
        out[rows] = vecs.float().cpu().numpy()
        bar.update(len(rows))
    bar.close()
    model.train(was_training)
    elapsed = time.perf_counter() - start
    if len(texts):
        log.info("encoded %d %ss in %.1fs (%.1f/s, %s)", len(texts), side, elapsed, len(texts) / max(elapsed, 1e-9), precision)
    return out


def encode_passages(model, tokenizer, passages, **kwargs) -> np.ndarray:
    strings = [passage_string(p.title, p.text, tokenizer.sep_token) for p in passages]
    return encode_texts(model, tokenizer, strings, "passage", **kwargs)


def encode_questions(model, tokenizer, questions: Sequence[str], **kwargs) -> np.ndarray:
    return encode_texts(model, tokenizer, questions, "question", **kwargs)
