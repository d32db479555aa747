"""Answering questions from their retrieved passages (DPR's reader inference).

Every question's first max(k) passages are read once (in batches of passages across questions);
each gets a selection logit and its best span. For each k, the answer is the best span of the
passage with the highest selection logit among the first k (DPR's `passage_thresholds`); a
passage with no token left after the question and title is passed over.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from taser.progress import progress
from taser.reader.inputs import PassageInput, encode_passages, pad_passages
from taser.reader.metrics import score_prediction
from taser.reader.model import Reader
from taser.reader.spans import Span, best_span, span_text
from taser.runtime import autocast

log = logging.getLogger(__name__)


@dataclass
class ReadPassage:
    relevance: float
    span: Span | None
    answer: str  # "" without a span
    char_start: int
    char_end: int


def _pairs(records: Sequence[dict], tokenizer, k: int, max_length: int, max_question_length: int) -> Iterator[tuple[int, int, PassageInput]]:
    for qi, record in enumerate(records):
        ctxs = record["ctxs"][:k]
        for pi, inp in enumerate(encode_passages(tokenizer, record["question"], ctxs, max_length, max_question_length)):
            yield qi, pi, inp


@torch.inference_mode()
def read_passages(model: Reader, tokenizer, records: Sequence[dict], k: int, max_answer_length: int, batch_size: int,
                  precision: str, device: torch.device, show_progress: bool = True) -> list[list[ReadPassage]]:
    """Per record, its first `k` passages read: selection logit and best span."""
    model.to(device).eval()
    cfg = model.config
    out: list[list[ReadPassage | None]] = [[None] * min(k, len(r["ctxs"])) for r in records]
    total = sum(len(row) for row in out)
    bar = progress(total=total, desc="read", unit="passage", enabled=show_progress)
    chunk: list[tuple[int, int, PassageInput]] = []

    def flush():
        ids, mask, _ = pad_passages([[inp for _, _, inp in chunk]], tokenizer.pad_token_id or 0)
        with autocast(precision, device):
            result = model(ids.to(device), mask.to(device))
        starts, ends, rel = result.start_logits[0].float().cpu(), result.end_logits[0].float().cpu(), result.relevance_logits[0].float().cpu()
        for j, (qi, pi, inp) in enumerate(chunk):
            span = best_span(starts[j], ends[j], inp, max_answer_length)
            text = records[qi]["ctxs"][pi]["text"]
            answer, begin, end = span_text(inp, text, span) if span is not None else ("", -1, -1)
            out[qi][pi] = ReadPassage(float(rel[j]), span, answer, begin, end)
        bar.update(len(chunk))
        chunk.clear()

    for pair in _pairs(records, tokenizer, k, cfg.max_length, cfg.max_question_length):
        chunk.append(pair)
        if len(chunk) == batch_size:
            flush()
    if chunk:
        flush()
    bar.close()
    return out  # type: ignore[return-value]


def choose(passages: Sequence[ReadPassage], k: int) -> int | None:
    """The index of the answering passage among the first `k`: the highest selection logit among
    those with a span (the earliest on a tie); None when none has one."""
    best = None
    for i, p in enumerate(passages[:k]):
        if p.span is not None and (best is None or p.relevance > passages[best].relevance):
            best = i
    return best


def predict(record: dict, passages: Sequence[ReadPassage], k: int, match: str) -> dict:
    """The answer to `record` from its first `k` read `passages` (`choose`), scored against its answers
    (EM and F1 under `match`), with the passage and span it came from."""
    index = choose(passages, k)
    p, ctx = (None, {}) if index is None else (passages[index], record["ctxs"][index])
    answer = "" if p is None else p.answer
    em, f1 = score_prediction(answer, record["answers"], match)
    return {"prediction": answer, "passage_id": ctx.get("id"), "passage_rank": None if index is None else index + 1,
            "score": None if p is None else p.relevance, "span_score": None if p is None else p.span.score,
            "char_start": None if p is None else p.char_start, "char_end": None if p is None else p.char_end, "em": em, "f1": f1}
