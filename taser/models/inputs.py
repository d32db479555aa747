"""Tokenisation of questions and passages (`title [SEP] text`), padded to the batch's longest."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def passage_string(title: str, text: str, sep_token: str) -> str:
    return f"{title} {sep_token} {text}" if title else text


def tokenize_questions(tokenizer, questions: Sequence[str], max_length: int) -> dict[str, torch.Tensor]:
    enc = tokenizer(list(questions), padding="longest", truncation=True, max_length=max_length, return_tensors="pt")
    return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}


def tokenize_passages(tokenizer, titles: Sequence[str], texts: Sequence[str], max_length: int) -> dict[str, torch.Tensor]:
    strings = [passage_string(t, x, tokenizer.sep_token) for t, x in zip(titles, texts)]
    enc = tokenizer(strings, padding="longest", truncation=True, max_length=max_length, return_tensors="pt")
    return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}
