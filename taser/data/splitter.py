"""Split articles into disjoint passages of a fixed number of words (DPR: 100), keeping the title."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WordBlock:
    text: str
    start_word: int  # index of the block's first word in the article


def split_words(text: str, words_per_passage: int = 100) -> list[WordBlock]:
    if words_per_passage < 1:
        raise ValueError("words_per_passage must be >= 1")
    words = text.split()
    return [
        WordBlock(" ".join(words[i : i + words_per_passage]), i)
        for i in range(0, len(words), words_per_passage)
    ]
