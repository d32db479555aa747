"""Each training question's gold passage (the passage its answer was written from), where the data
have one: SQuAD's paragraph, NQ's and TriviaQA's in DPR's gold-passage files.

Two layouts are read, told apart by their top level:

- a list: DPR's bi-encoder training JSON (`scripts/prepare_squad.py`'s `train.json`, DPR's
  `nq-train.json`), whose first `positive_ctxs` entry is the gold passage (`passage_id`, `title`,
  `text`), with the question's `answers`;
- an object with `data`: DPR's gold-passage files (`gold_passages_info/nq_train.json`), each entry
  `{"question", "title", "context", ...}`, without answers (the answers come from the retrieval
  JSON whose questions they are matched to).

Questions are matched by their text, normalised as the reader tokenises it, stripped and
lower-cased (DPR's gold files keep NQ's lower-case questions).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from taser.data.errors import DataFormatError
from taser.models.inputs import normalize_question


@dataclass(frozen=True)
class GoldPassage:
    question: str  # as the file writes it
    ctx: dict  # {"id", "title", "text", "has_answer": True}: the form of a retrieved ctx
    answers: tuple[str, ...] | None  # None: the file gives none (DPR's gold-passage files)


def question_key(question: str) -> str:
    return " ".join(normalize_question(question).split()).lower()


def _from_biencoder(path) -> dict[str, GoldPassage]:
    from taser.data.biencoder_json import BiEncoderJsonFile

    gold = {}
    for i, record in enumerate(BiEncoderJsonFile(path)):  # streamed and checked: NQ's file is several GB
        ctx = record["positive_ctxs"][0]
        pid = ctx.get("passage_id", ctx.get("id"))
        ident = str(pid) if pid is not None else f"gold:{i}"
        gold.setdefault(question_key(record["question"]), GoldPassage(record["question"],
            {"id": ident, "title": ctx.get("title") or "", "text": ctx["text"], "has_answer": True}, tuple(record.get("answers") or ()) or None))
    return gold


def _from_gold_info(path, entries) -> dict[str, GoldPassage]:
    if not isinstance(entries, list):
        raise DataFormatError(path, "'data'", "expected a list of gold-passage entries")
    gold = {}
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or not isinstance(entry.get("question"), str) or not isinstance(entry.get("context"), str):
            raise DataFormatError(path, f"data[{i}]", "a gold-passage entry needs 'question' and 'context' strings")
        title = entry.get("title") or ""
        if not isinstance(title, str):
            raise DataFormatError(path, f"data[{i}]", "'title' must be a string")
        ident = str(entry.get("example_id", f"gold:{i}"))
        ctx = {"id": ident, "title": title, "text": entry["context"], "has_answer": True}
        gold.setdefault(question_key(entry["question"]), GoldPassage(entry["question"], ctx, None))
    return gold


def read_gold_passages(path: str | os.PathLike) -> dict[str, GoldPassage]:
    """{question key: its gold passage} of a bi-encoder JSON or a DPR gold-passage file.
    The first entry of a question repeated in the file is kept."""
    try:
        with open(path, encoding="utf-8") as f:
            first = f.read(4096).lstrip()[:1]
            if first == "[":
                top = None
            else:
                f.seek(0)
                top = json.load(f)
    except FileNotFoundError:
        raise DataFormatError(path, "file", "not found (gold_file: a bi-encoder training JSON or DPR's gold-passage file)") from None
    except json.JSONDecodeError as e:
        raise DataFormatError(path, f"line {e.lineno}, column {e.colno}", f"not valid JSON: {e.msg}") from None
    if top is None:
        gold = _from_biencoder(path)
    elif isinstance(top, dict) and "data" in top:
        gold = _from_gold_info(path, top["data"])
    else:
        raise DataFormatError(path, "top level", "expected a bi-encoder JSON list or DPR's gold-passage object {\"data\": [...]}")
    if not gold:
        raise DataFormatError(path, "top level", "no gold passage in the file")
    return gold


def find_gold(gold: dict[str, GoldPassage], question: str) -> GoldPassage | None:
    return gold.get(question_key(question))
