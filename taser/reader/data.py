"""The reader's data: retrieval JSON files (DPR's `{"question", "answers", "ctxs"}` records, as
`scripts/evaluate.py` writes them), checked for what reading needs, and the training questions
drawn from them:

- open-domain (`training_set`): DPR's: the positive among the retrieved passages that hold an
  answer, negatives among those that do not; with gold passages known (`taser.reader.gold`), the
  question's gold passage is its one positive (DPR's use of NQ's gold information), and it is never
  a negative;
- reading comprehension (`reading_set`): each question's gold passage alone, no negatives.

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
from taser.reader.gold import GoldPassage, find_gold, read_gold_passages
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
    gold_positives: int = 0  # questions whose positive is their gold passage


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


def _with_span(tokenizer, question: str, answers: Sequence[str], ctxs: list[dict], max_length: int, max_question_length: int) -> list[dict]:
    """The ctxs in which an answer's tokens are found within `max_length`."""
    tokens = answer_token_ids(tokenizer, answers)
    inputs = encode_passages(tokenizer, question, ctxs, max_length, max_question_length)
    return [c for c, p in zip(ctxs, inputs) if answer_spans(p, tokens, 1)]


def training_set(path: str | os.PathLike, tokenizer, top_n: int, max_length: int, max_question_length: int, match: str = "string",
                 gold: dict[str, GoldPassage] | None = None) -> TrainingSet:
    """The training questions of retrieval JSON `path`: per question, its first `top_n` passages
    split into positives and negatives. With `gold` (`read_gold_passages`), a question whose gold
    passage holds an answer's tokens has it as its only positive (found among the retrieved ones by
    id or text, or added when the retriever missed it), and its retrieved copy is never a negative;
    the others keep DPR's positives. A question without a positive is skipped and counted (no
    passage holds an answer, or none holds the answer's tokens within `max_length`)."""
    questions, skipped = [], {"no positive in the top passages": 0, "answer tokens not found in a positive": 0}
    used_gold = 0
    shared: dict = {}  # one copy of each passage (by id), whichever questions retrieved it; each record is dropped once read
    for record in iter_for_reader(path):
        ctxs = [_compact(c, shared) for c in record["ctxs"][:top_n]]
        holds = [_holds_answer(c, record["answers"], match) for c in ctxs]
        found = find_gold(gold, record["question"]) if gold else None
        positives = []
        if found is not None:
            is_gold = [c["id"] == found.ctx["id"] or c["text"] == found.ctx["text"] for c in ctxs]
            holds = [h or g for h, g in zip(holds, is_gold)]  # the gold passage is never a negative
            positives = _with_span(tokenizer, record["question"], record["answers"], [found.ctx], max_length, max_question_length)
            used_gold += bool(positives)
        if not positives:
            positives = [c for c, h in zip(ctxs, holds) if h]
            if not positives:
                skipped["no positive in the top passages"] += 1
                continue
            positives = _with_span(tokenizer, record["question"], record["answers"], positives, max_length, max_question_length)
        if not positives:
            skipped["answer tokens not found in a positive"] += 1
            continue
        questions.append(TrainQuestion(record["question"], list(record["answers"]), positives, [c for c, h in zip(ctxs, holds) if not h]))
    if not questions:
        raise DataFormatError(path, "all records", f"no question has a positive passage in its top {top_n} ({skipped})")
    log.info("%s: %d training questions (%d with their gold passage as the positive); skipped %s", path, len(questions), used_gold, skipped)
    return TrainingSet(questions, skipped, gold_positives=used_gold)


def reading_set(gold_path: str | os.PathLike, tokenizer, max_length: int, max_question_length: int, train_file: str | os.PathLike | None = None) -> TrainingSet:
    """Reading comprehension: each question with its gold passage as its one passage, no negatives.

    The questions and answers are `train_file`'s (a retrieval JSON, its passages unread) when given,
    each matched to its gold passage in `gold_path`; else the gold file's own (a bi-encoder JSON;
    DPR's gold-passage files carry no answers). A question without a gold passage, or whose
    answer's tokens are not in it within `max_length`, is skipped and counted."""
    gold = read_gold_passages(gold_path)
    skipped = {"no gold passage": 0, "answer tokens not found in the gold passage": 0}
    if train_file is not None:
        pairs = ((r["question"], r["answers"], find_gold(gold, r["question"])) for r in iter_for_reader(train_file))
    else:
        if any(g.answers is None for g in gold.values()):
            raise DataFormatError(gold_path, "top level", "this gold-passage file has no answers: give train_file=<retrieval JSON of its questions> too")
        pairs = ((g.question, list(g.answers), g) for g in gold.values())
    questions = []
    for question, answers, found in pairs:
        if found is None:
            skipped["no gold passage"] += 1
            continue
        if not _with_span(tokenizer, question, answers, [found.ctx], max_length, max_question_length):
            skipped["answer tokens not found in the gold passage"] += 1
            continue
        questions.append(TrainQuestion(question, list(answers), [found.ctx], []))
    if not questions:
        raise DataFormatError(gold_path, "all records", f"no question has a gold passage holding its answer ({skipped})")
    log.info("%s: %d reading-comprehension questions (gold passages); skipped %s", gold_path, len(questions), skipped)
    return TrainingSet(questions, skipped, gold_positives=len(questions))
