"""BEIR datasets: `corpus.jsonl`, `queries.jsonl` and `qrels/<split>.tsv`.

corpus.jsonl: one JSON object per line with `_id`, `text` and (optional) `title`.
queries.jsonl: one JSON object per line with `_id` and `text`.
qrels: tab-separated `query-id  corpus-id  score` with that header line; scores are integers.
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Iterator
from typing import Any

from taser.data.errors import DataFormatError
from taser.data.passages import Passage

QRELS_HEADER = ["query-id", "corpus-id", "score"]


def _exists(path: str | os.PathLike, what: str) -> None:
    if not os.path.exists(path):
        raise FileNotFoundError(f"BEIR {what} file not found: {path}")


def _json_lines(path: str | os.PathLike) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for each non-blank line of a JSON-lines file."""
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataFormatError(path, f"line {line_no}", f"invalid JSON ({e.msg} at column {e.colno})") from None
            if not isinstance(obj, dict):
                raise DataFormatError(path, f"line {line_no}", f"expected a JSON object, got {type(obj).__name__}")
            yield line_no, obj


def _id(obj: dict, path: str | os.PathLike, line_no: int) -> str:
    value = obj.get("_id")
    if value is None:
        raise DataFormatError(path, f"line {line_no}", "missing field '_id'")
    # Some BEIR-style files carry numeric ids; ids are strings everywhere else.
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or not value.strip():
        raise DataFormatError(path, f"line {line_no}", f"'_id' must be a non-empty string, got {value!r}")
    return value


def _text_field(obj: dict, name: str, path: str | os.PathLike, line_no: int, required: bool = True) -> str:
    if name not in obj:
        if required:
            raise DataFormatError(path, f"line {line_no}", f"missing field {name!r}")
        return ""
    value = obj[name]
    if value is None and not required:
        return ""
    if not isinstance(value, str):
        raise DataFormatError(path, f"line {line_no}", f"field {name!r} must be a string, got {type(value).__name__}")
    return value


def read_beir_corpus(path: str | os.PathLike) -> Iterator[Passage]:
    """Stream the documents of a BEIR `corpus.jsonl` as passages (title may be empty)."""
    _exists(path, "corpus")
    for line_no, obj in _json_lines(path):
        yield Passage(
            _id(obj, path, line_no),
            _text_field(obj, "text", path, line_no),
            _text_field(obj, "title", path, line_no, required=False),
        )


def read_beir_queries(path: str | os.PathLike) -> dict[str, str]:
    """{query id: query text} from a BEIR `queries.jsonl`."""
    _exists(path, "queries")
    queries: dict[str, str] = {}
    for line_no, obj in _json_lines(path):
        qid = _id(obj, path, line_no)
        if qid in queries:
            raise DataFormatError(path, f"line {line_no}", f"duplicate query id {qid!r}")
        queries[qid] = _text_field(obj, "text", path, line_no)
    return queries


def read_beir_qrels(path: str | os.PathLike) -> dict[str, dict[str, int]]:
    """{query id: {corpus id: score}} from a BEIR qrels TSV (with its header line)."""
    _exists(path, "qrels")
    qrels: dict[str, dict[str, int]] = {}
    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.reader(f, delimiter="\t")
        header = next(reader, None)
        if header is None or [h.strip().lower() for h in header] != QRELS_HEADER:
            raise DataFormatError(path, "line 1", f"expected the header query-id<TAB>corpus-id<TAB>score, got {header!r}")
        for row in reader:
            line = reader.line_num
            if not row or not any(field.strip() for field in row):
                continue
            if len(row) != 3:
                raise DataFormatError(path, f"line {line}", f"expected 3 tab-separated fields, got {len(row)}")
            qid, docid, raw = (field.strip() for field in row)
            if not qid or not docid:
                raise DataFormatError(path, f"line {line}", "empty query-id or corpus-id")
            try:
                score = int(raw)
            except ValueError:
                raise DataFormatError(path, f"line {line}", f"score must be an integer, got {raw!r}") from None
            judged = qrels.setdefault(qid, {})
            if judged.get(docid, score) != score:
                raise DataFormatError(path, f"line {line}", f"conflicting scores for ({qid!r}, {docid!r}): {judged[docid]} and {score}")
            judged[docid] = score
    return qrels
