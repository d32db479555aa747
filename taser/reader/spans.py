"""From a passage's start and end logits to an answer in its text (DPR's `get_best_spans`).

The best span maximises start logit + end logit over start <= end < start + max_answer_length,
both inside the passage's tokens (never in the question or the title). It is widened to whole
words (DPR's `_extend_span_to_full_words`: a span never ends inside a word), and its tokens'
character offsets give the answer as it is written in the passage.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from taser.reader.inputs import PassageInput


@dataclass
class Span:
    start: int  # index among the passage's tokens
    end: int  # inclusive
    score: float  # start logit + end logit


def best_span(start_logits: torch.Tensor, end_logits: torch.Tensor, passage: PassageInput, max_answer_length: int) -> Span | None:
    """The best span of `passage` from its logits over its whole input ([L], L >= len(input_ids)),
    or None when no passage token was kept."""
    first, n = passage.passage_start, len(passage.input_ids) - passage.passage_start
    if n <= 0:
        return None
    start = start_logits[first : first + n].float()
    end = end_logits[first : first + n].float()
    scores = start[:, None] + end[None, :]
    i = torch.arange(n)
    allowed = (i[None, :] >= i[:, None]) & (i[None, :] < i[:, None] + max_answer_length)
    flat = scores.masked_fill(~allowed, float("-inf")).flatten()
    best = int(flat.argmax())
    return Span(best // n, best % n, float(flat[best]))


def widen_to_words(span: Span, word_ids: list[int | None]) -> Span:
    """`span` grown to the first token of its first word and the last token of its last word."""
    s, e = span.start, span.end
    while s > 0 and word_ids[s] is not None and word_ids[s - 1] == word_ids[s]:
        s -= 1
    while e + 1 < len(word_ids) and word_ids[e] is not None and word_ids[e + 1] == word_ids[e]:
        e += 1
    return Span(s, e, span.score)


def span_text(passage: PassageInput, text: str, span: Span) -> tuple[str, int, int]:
    """(answer text, first character, character after the last) of `span` in the passage `text`."""
    span = widen_to_words(span, passage.word_ids)
    begin, finish = passage.offsets[span.start][0], passage.offsets[span.end][1]
    return text[begin:finish], begin, finish
