"""The reader's data: retrieval JSON files (DPR's `{"question", "answers", "ctxs"}` records, as
`scripts/evaluate.py` writes them), checked for what reading needs, and the training questions
drawn from them (DPR's: a positive among the retrieved passages that hold an answer, negatives
among those that do not).

Bad input stops with the file, the record and what is wrong (`DataFormatError`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from taser.data.errors import DataFormatError
from taser.data.retrieval_json import iter_retrieval_results
from taser.evaluation.answers import has_answer
from taser.reader.inputs import answer_spans, answer_token_ids, encode_passages

log = logging.getLogger(__name__)


def _check_ctxs(path, i: int, record: dict, needed: int | None) -> None:
    ctxs = record["ctxs"]
    if not ctxs:
        raise DataFormatError(path, f"record {i} ({record['question']!r})", "'ctxs' is empty: no retrieved passage to read")
    if needed is not None and len(ctxs) < needed:
        raise DataFormatError(path, f"record {i} ({record['question']!r})",
                              f"{len(ctxs)} passages retrieved, fewer than k={needed}: lower the largest k, or retrieve more passages")
    for j, ctx in enumerate(ctxs[: needed or len(ctxs)]):
        if not isinstance(ctx.get("text"), str):
            raise DataFormatError(path, f"record {i}, ctx {j}", "no 'text' string (the passage the reader reads)")
        if ctx.get("title") is not None and not isinstance(ctx["title"], str):
            raise DataFormatError(path, f"record {i}, ctx {j}", "'title' must be a string")


def iter_for_reader(path: str | os.PathLike, k: int | None = None, max_questions: int | None = None) -> Iterator[dict]:
    """The records of retrieval JSON `path` (the first `max_questions`), one at a time, each checked
    to have answers and at least `k` passages with text (all of them with text when `k` is None).
    Streamed: NQ's training retrieval (58,880 questions x 100 passages) is never held whole."""
    for i, record in enumerate(iter_retrieval_results(path)):
        if max_questions is not None and i >= max_questions:
            return
        if not isinstance(record["question"], str):
            raise DataFormatError(path, f"record {i}", "'question' must be a string")
        answers = record["answers"]
        if not answers or not all(isinstance(a, str) for a in answers):
            raise DataFormatError(path, f"record {i} ({record['question']!r})", f"'answers' must be a non-empty list of strings, got {answers!r}")
        _check_ctxs(path, i, record, k)
        yield record


def read_for_reader(path: str | os.PathLike, k: int | None = None, max_questions: int | None = None) -> list[dict]:
    """`iter_for_reader`'s records as a list."""
    return list(iter_for_reader(path, k, max_questions))


@dataclass
class TrainQuestion:
    question: str
    answers: list[str]
    positives: list[dict]  # passages holding an answer whose tokens are found in them (DPR picks one)
    negatives: list[dict]  # passages without an answer, in the retriever's order


@dataclass
class TrainingSet:
    questions: list[TrainQuestion]
    skipped: dict[str, int] = field(default_factory=dict)  # why questions were left out, and how many


def _compact(ctx: dict, shared: dict) -> dict:
    """What training reads of a ctx (id, title, text, has_answer), one dict per passage id and answer flag."""
    key = (str(ctx["id"]), ctx.get("has_answer"))
    kept = shared.get(key)
    if kept is None:
        kept = shared[key] = {"id": key[0], "title": ctx.get("title") or "", "text": ctx["text"], "has_answer": ctx.get("has_answer")}
    return kept


def _holds_answer(ctx: dict, answers: Sequence[str], match: str) -> bool:
    if "has_answer" in ctx and ctx["has_answer"] is not None:
        return bool(ctx["has_answer"])
    return has_answer(answers, ctx["text"], match)


def training_set(path: str | os.PathLike, tokenizer, top_n: int, max_length: int, max_question_length: int, match: str = "string") -> TrainingSet:
    """The training questions of retrieval JSON `path`: per question, its first `top_n` passages
    split into positives and negatives. A question without a positive is skipped and counted
    (no passage holds an answer, or none holds the answer's tokens within `max_length`)."""
    questions, skipped = [], {"no positive in the top passages": 0, "answer tokens not found in a positive": 0}
    shared: dict = {}  # one copy of each passage (by id), whichever questions retrieved it; each record is dropped once read
    for record in iter_for_reader(path):
        ctxs = [_compact(c, shared) for c in record["ctxs"][:top_n]]
        holds = [_holds_answer(c, record["answers"], match) for c in ctxs]
        positives = [c for c, h in zip(ctxs, holds) if h]
        if not positives:
            skipped["no positive in the top passages"] += 1
            continue
        answers = answer_token_ids(tokenizer, record["answers"])
        inputs = encode_passages(tokenizer, record["question"], positives, max_length, max_question_length)
        positives = [c for c, p in zip(positives, inputs) if answer_spans(p, answers, 1)]
        if not positives:
            skipped["answer tokens not found in a positive"] += 1
            continue
        questions.append(TrainQuestion(record["question"], list(record["answers"]), positives, [c for c, h in zip(ctxs, holds) if not h]))
    if not questions:
        raise DataFormatError(path, "all records", f"no question has a positive passage in its top {top_n} ({skipped})")
    log.info("%s: %d training questions; skipped %s", path, len(questions), skipped)
    return TrainingSet(questions, skipped)
