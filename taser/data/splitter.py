"""Split articles into disjoint passages of a fixed number of words (DPR: 100), keeping the title."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WordBlock:
    text: str
    start_word: int  # index of the block's first word in the article


def split_words(text: str, words_per_passage: int = 100) -> list[WordBlock]:
    return split_word_list(text.split(), words_per_passage)


def split_word_list(words: list[str], words_per_passage: int = 100) -> list[WordBlock]:
    """Blocks of an already tokenised article (words without whitespace)."""
    if words_per_passage < 1:
        raise ValueError("words_per_passage must be >= 1")
    return [
        WordBlock(" ".join(words[i : i + words_per_passage]), i)
        for i in range(0, len(words), words_per_passage)
    ]
