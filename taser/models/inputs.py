"""Tokenisation of questions and passages as DPR and TASER do it, padded to the batch's longest.

- A question is first normalised as DPR's readers do (`normalize_question`: the typographic
  apostrophe ’ becomes '), then tokenised alone.
- A passage with a title is tokenised as the pair (title, text), DPR's and TASER's
  `tokenizer.encode(title, text_pair=text, truncation=True)`: `[CLS] title [SEP] text [SEP]`,
  truncated longest-first to `max_length` tokens, so a long title is cut too, not only the
  text. A passage without a title is its text alone.
- Token type ids are all zero for both sides, as DPR and TASER pass them (the encoders are
  called with `attention_mask` only).

When nothing is truncated, a titled passage's ids are those of the one string
`title [SEP] text` (`passage_string`, which a sentence-transformers export reads); they differ
only when the title is longer than about half of `max_length - 3` tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

TYPOGRAPHIC_APOSTROPHE = "\u2019"


def normalize_question(question: str) -> str:
    """A question as DPR's QA and training readers pass it to the tokenizer (’ -> ')."""
    return question.replace(TYPOGRAPHIC_APOSTROPHE, "'")


def passage_string(title: str, text: str, sep_token: str) -> str:
    """A passage as one string, `title [SEP] text` (the text alone without a title): the form for
    tools that take one string per text (a sentence-transformers export); see the module notes."""
    return f"{title} {sep_token} {text}" if title else text


def question_ids(tokenizer, questions: Sequence[str], max_length: int) -> list[list[int]]:
    """Token ids of each question (normalised, `[CLS] question [SEP]`, at most `max_length`)."""
    if not questions:
        return []
    return tokenizer([normalize_question(q) for q in questions], truncation=True, max_length=max_length)["input_ids"]


def passage_ids(tokenizer, titles: Sequence[str], texts: Sequence[str], max_length: int) -> list[list[int]]:
    """Token ids of each passage: (title, text) as a pair truncated longest-first, or the text
    alone when the title is empty; at most `max_length` each."""
    if len(titles) != len(texts):
        raise ValueError(f"{len(titles)} titles for {len(texts)} texts")
    ids: list[list[int] | None] = [None] * len(texts)
    titled = [i for i, title in enumerate(titles) if title]
    plain = [i for i, title in enumerate(titles) if not title]
    if titled:
        pairs = tokenizer([titles[i] for i in titled], [texts[i] for i in titled], truncation="longest_first", max_length=max_length)
        for i, row in zip(titled, pairs["input_ids"]):
            ids[i] = row
    if plain:
        alone = tokenizer([texts[i] for i in plain], truncation=True, max_length=max_length)
        for i, row in zip(plain, alone["input_ids"]):
            ids[i] = row
    return ids  # type: ignore[return-value]


def pad_batch(ids: Sequence[Sequence[int]], pad_token_id: int) -> dict[str, torch.Tensor]:
    """`input_ids` padded (right) to the longest row, and its `attention_mask`."""
    longest = max((len(row) for row in ids), default=0)
    input_ids = torch.full((len(ids), longest), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(ids), longest), dtype=torch.long)
    for j, row in enumerate(ids):
        input_ids[j, : len(row)] = torch.as_tensor(row, dtype=torch.long)
        mask[j, : len(row)] = 1
    return {"input_ids": input_ids, "attention_mask": mask}


def tokenize_questions(tokenizer, questions: Sequence[str], max_length: int) -> dict[str, torch.Tensor]:
    return pad_batch(question_ids(tokenizer, list(questions), max_length), tokenizer.pad_token_id)


def tokenize_passages(tokenizer, titles: Sequence[str], texts: Sequence[str], max_length: int) -> dict[str, torch.Tensor]:
    return pad_batch(passage_ids(tokenizer, list(titles), list(texts), max_length), tokenizer.pad_token_id)
