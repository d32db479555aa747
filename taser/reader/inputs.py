"""The reader's inputs: `[CLS] question [SEP] title [SEP] passage` token ids (DPR's reader layout),
with what maps the passage's tokens back to its characters (offsets, words), the answer spans
found in them, and the padded tensors of a batch.

The passage is tokenised on its own (a fast tokenizer gives each token's character offsets in
the passage text), then appended after the question and title, and cut at `max_length`. Answer
spans are found as DPR finds them: runs of the passage's token ids equal to an answer's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from taser.models.inputs import normalize_question


@dataclass
class PassageInput:
    input_ids: list[int]  # [CLS] question [SEP] title [SEP] passage tokens (cut at max_length)
    passage_start: int  # index in input_ids of the first passage token
    offsets: list[tuple[int, int]]  # each kept passage token's characters in the passage text
    word_ids: list[int | None]  # each kept passage token's word (the tokenizer's pre-tokenised word)

    @property
    def passage_ids(self) -> list[int]:
        return self.input_ids[self.passage_start :]


def _special_ids(tokenizer) -> tuple[int, int]:
    if tokenizer.cls_token_id is None or tokenizer.sep_token_id is None:
        raise ValueError(f"{type(tokenizer).__name__} has no [CLS] or [SEP] token: the reader needs a BERT-family tokenizer")
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError(f"{type(tokenizer).__name__} is not a fast tokenizer: the reader needs its character offsets")
    return tokenizer.cls_token_id, tokenizer.sep_token_id


def question_ids(tokenizer, question: str, max_question_length: int) -> list[int]:
    """The question's first `max_question_length` tokens, normalised as the retrievers read it (’ -> ')."""
    return tokenizer(normalize_question(question), add_special_tokens=False)["input_ids"][:max_question_length]


def encode_passages(tokenizer, question: str, ctxs: Sequence[dict], max_length: int, max_question_length: int) -> list[PassageInput]:
    """The inputs of `question` with each ctx (`title`, `text`) of `ctxs`."""
    cls, sep = _special_ids(tokenizer)
    q = question_ids(tokenizer, question, max_question_length)
    if not ctxs:
        return []
    titles = tokenizer([c.get("title") or "" for c in ctxs], add_special_tokens=False)["input_ids"]
    texts = tokenizer([c["text"] for c in ctxs], add_special_tokens=False, return_offsets_mapping=True)
    out = []
    for i, title in enumerate(titles):
        head = [cls, *q, sep]
        title = title[: max(0, max_length - len(head) - 2)]  # room for [SEP] and at least one passage token
        prefix = head + title + [sep]
        room = max(0, max_length - len(prefix))
        ids = texts["input_ids"][i][:room]
        out.append(PassageInput(prefix + ids, len(prefix), [tuple(o) for o in texts["offset_mapping"][i][:room]],
                                list(texts.word_ids(i)[:room])))
    return out


def answer_token_ids(tokenizer, answers: Sequence[str]) -> list[list[int]]:
    """Each answer's token ids, as the passage's tokens would read it (empty answers dropped)."""
    encoded = tokenizer(list(answers), add_special_tokens=False)["input_ids"] if answers else []
    return [ids for ids in encoded if ids]


def answer_spans(passage: PassageInput, answers: Sequence[Sequence[int]], max_answers: int) -> list[tuple[int, int]]:
    """The (start, end) positions in `passage.input_ids` (end inclusive) of every run of the passage's
    tokens equal to an answer's tokens, in passage order, at most `max_answers` (DPR: 10)."""
    tokens = passage.passage_ids
    spans = set()
    for answer in answers:
        n = len(answer)
        first = answer[0]
        for i in range(len(tokens) - n + 1):
            if tokens[i] == first and tokens[i : i + n] == list(answer):
                spans.add((passage.passage_start + i, passage.passage_start + i + n - 1))
    return sorted(spans)[:max_answers]


def pad_passages(batch: Sequence[Sequence[PassageInput]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids [N, M, L], attention_mask [N, M, L], passage_mask [N, M]) of N questions' passages:
    L the longest input, M the most passages; a question with fewer gets empty rows (`[CLS]` only,
    outside `passage_mask`)."""
    n = len(batch)
    m = max(len(passages) for passages in batch)
    length = max(len(p.input_ids) for passages in batch for p in passages)
    ids = torch.full((n, m, length), pad_id, dtype=torch.long)
    mask = torch.zeros((n, m, length), dtype=torch.long)
    present = torch.zeros((n, m), dtype=torch.bool)
    for i, passages in enumerate(batch):
        for j, p in enumerate(passages):
            ids[i, j, : len(p.input_ids)] = torch.tensor(p.input_ids, dtype=torch.long)
            mask[i, j, : len(p.input_ids)] = 1
            present[i, j] = True
        for j in range(len(passages), m):  # an empty row: one token, so its attention is defined
            ids[i, j, 0] = passages[0].input_ids[0] if passages else pad_id
            mask[i, j, 0] = 1
    return ids, mask, present
