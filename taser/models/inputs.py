"""Tokenisation of questions and passages as DPR and TASER do it, padded to the batch's longest.

- A question is first normalised as DPR's readers do (`normalize_question`: the typographic
  apostrophe ’ becomes '), then tokenised alone.
- A passage with a title is tokenised as the pair (title, text), DPR's and TASER's
  `tokenizer.encode(title, text_pair=text, truncation=True)`: `[CLS] title [SEP] text [SEP]`,
  truncated longest-first to `max_length` tokens, so a long title is cut too, not only the
  text. They tokenise with the slow `BertTokenizer` of transformers 4.x, whose longest-first
  loop removes one token at a time from the longer side and, when both are equally long, from
  the text; a fast tokenizer cuts the title there instead (at max_length 32, a 28-token title
  keeps 15 tokens in DPR and TASER, 14 with a fast tokenizer). The pair is therefore truncated
  here, by the slow tokenizer's rule (`longest_first`), and the ids are identical to theirs.
  A passage without a title is its text alone.
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


def longest_first(first: int, second: int, budget: int) -> tuple[int, int]:
    """How many tokens of each sequence of a pair transformers 4.x's slow tokenizers keep when
    truncating longest-first to `budget` (without the special tokens): their loop removes the last
    token of the first sequence while it is strictly longer, else of the second; so the longer
    loses tokens until the two tie, then the second, the first, ... in turn."""
    excess = first + second - budget
    if excess <= 0:
        return first, second
    gap = abs(first - second)
    if excess <= gap:
        return (first - excess, second) if first > second else (first, second - excess)
    rest, tied = excess - gap, min(first, second)
    return tied - rest // 2, tied - (rest - rest // 2)


def pair_template(tokenizer) -> tuple[list[int], list[int], list[int]]:
    """The special tokens the tokenizer puts before, between and after a pair of sequences
    (BERT: [CLS] / [SEP] / [SEP]; RoBERTa: <s> / </s></s> / </s>), read from one probe pair."""
    a, b = tokenizer(["a", "b"], add_special_tokens=False)["input_ids"]
    pair = tokenizer("a", "b")["input_ids"]
    i = next(i for i in range(len(pair)) if pair[i : i + len(a)] == a)
    j = next(j for j in range(i + len(a), len(pair)) if pair[j : j + len(b)] == b)
    return pair[:i], pair[i + len(a) : j], pair[j + len(b) :]


def passage_ids(tokenizer, titles: Sequence[str], texts: Sequence[str], max_length: int) -> list[list[int]]:
    """Token ids of each passage: (title, text) as a pair truncated longest-first by the slow
    tokenizer's rule (`longest_first`), or the text alone when the title is empty; at most
    `max_length` each."""
    if len(titles) != len(texts):
        raise ValueError(f"{len(titles)} titles for {len(texts)} texts")
    ids: list[list[int] | None] = [None] * len(texts)
    titled = [i for i, title in enumerate(titles) if title]
    plain = [i for i, title in enumerate(titles) if not title]
    if titled:
        before, between, after = pair_template(tokenizer)
        budget = max_length - len(before) - len(between) - len(after)
        if budget < 2:
            raise ValueError(f"max_length {max_length} leaves {budget} tokens for a title and a text after the special tokens")
        # each side cut to the budget first: neither can keep more, and the rule gives the same split from there
        firsts = tokenizer([titles[i] for i in titled], add_special_tokens=False, truncation=True, max_length=budget)["input_ids"]
        seconds = tokenizer([texts[i] for i in titled], add_special_tokens=False, truncation=True, max_length=budget)["input_ids"]
        for i, first, second in zip(titled, firsts, seconds):
            keep_first, keep_second = longest_first(len(first), len(second), budget)
            ids[i] = before + first[:keep_first] + between + second[:keep_second] + after
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
