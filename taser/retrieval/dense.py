"""Dense retrieval: encode questions with a bi-encoder, search a passage index."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from taser.models.encoding import encode_questions
from taser.progress import progress as progress_bar

if TYPE_CHECKING:
    from taser.retrieval.faiss_index import PassageIndex

SEARCH_BLOCK = 1024  # questions per index search: a search of many questions shows its progress


def dense_retrieve(model, tokenizer, index: PassageIndex, questions: Sequence[str], k: int, batch_size: int = 128,
                   precision: str = "auto", progress: bool = True) -> list[list[tuple[str, float]]]:
    """Per question, the top-`k` (passage id, score) pairs of `index`, best first.

    `progress`: bars (with ETA) for encoding the questions and for searching; a caller with a bar
    of its own (mining, block by block) turns them off.
    """
    vectors = encode_questions(model, tokenizer, list(questions), batch_size=batch_size, precision=precision, progress=progress)
    results: list[list[tuple[str, float]]] = []
    with progress_bar(total=len(vectors), desc="search the index", unit="question", enabled=progress and len(vectors) > SEARCH_BLOCK) as bar:
        for start in range(0, len(vectors), SEARCH_BLOCK):
            block = np.ascontiguousarray(vectors[start : start + SEARCH_BLOCK])
            scores, ids = index.search(block, k)
            results += [list(zip(row_ids, map(float, row_scores))) for row_ids, row_scores in zip(ids, scores)]
            bar.update(len(block))
    return results
