"""Dense retrieval: encode questions with a bi-encoder, search a passage index."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from taser.models.encoding import encode_questions

if TYPE_CHECKING:
    from taser.retrieval.faiss_index import PassageIndex


def dense_retrieve(model, tokenizer, index: PassageIndex, questions: Sequence[str], k: int, batch_size: int = 128,
                   precision: str = "auto") -> list[list[tuple[str, float]]]:
    """Per question, the top-`k` (passage id, score) pairs of `index`, best first."""
    vectors = encode_questions(model, tokenizer, list(questions), batch_size=batch_size, precision=precision)
    scores, ids = index.search(vectors, k)
    return [list(zip(row_ids, map(float, row_scores))) for row_ids, row_scores in zip(ids, scores)]
