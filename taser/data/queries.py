"""Queries without answers, for search: a TSV or a JSON-lines file, read into {query id: text}.

TSV, one query a line, by its columns:
- `id<TAB>text` (MS MARCO's and BEIR's query TSVs);
- `question<TAB>["answer", ...]` (DPR's QA TSV: the answers are ignored; ids are `q1`, `q2`, ... by line);
- `text` alone (ids by line).
JSONL: one object a line with an id (`_id`, `id` or `qid`) and a text (`text`, `query` or `question`);
BEIR's `queries.jsonl` is of this kind."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

from taser.data.errors import DataFormatError
from taser.data.jsonl import json_lines

ID_FIELDS = ("_id", "id", "qid")
TEXT_FIELDS = ("text", "query", "question")


def read_queries(path: str | os.PathLike) -> dict[str, str]:
    """{query id: text} of a queries TSV or JSONL (`.jsonl`/`.json`), in file order; ids unique, texts non-empty."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"queries file {path} does not exist" if not os.path.exists(path) else f"queries file {path} is not a file")
    rows = _jsonl_rows(path) if Path(path).suffix in (".jsonl", ".json") else _tsv_rows(path)
    queries: dict[str, str] = {}
    for where, qid, text in rows:
        if not text.strip():
            raise DataFormatError(path, where, "empty query text")
        if qid in queries:
            raise DataFormatError(path, where, f"duplicate query id {qid!r}")
        queries[qid] = text.strip()
    if not queries:
        raise DataFormatError(path, "top level", "no query in the file")
    return queries


def _is_answer_list(cell: str) -> bool:
    try:
        value = json.loads(cell)
    except ValueError:
        return False
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _tsv_rows(path):
    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        number = 0
        for row in reader:
            if not row or not any(cell.strip() for cell in row):
                continue
            number += 1
            where = f"line {reader.line_num}"
            if len(row) == 1:
                yield where, f"q{number}", row[0]
            elif len(row) == 2 and _is_answer_list(row[1]):
                yield where, f"q{number}", row[0]
            elif len(row) == 2:
                if not row[0].strip() or any(c.isspace() for c in row[0].strip()):
                    raise DataFormatError(path, where, f"query id {row[0]!r} is empty or holds spaces (expected id<TAB>text)")
                yield where, row[0].strip(), row[1]
            else:
                raise DataFormatError(path, where, f"{len(row)} tab-separated columns: expected id<TAB>text, question<TAB>answers or text alone")


def _jsonl_rows(path):
    for line, obj in json_lines(path):
        where = f"line {line}"
        qid = next((obj[k] for k in ID_FIELDS if k in obj), None)
        text = next((obj[k] for k in TEXT_FIELDS if k in obj), None)
        if isinstance(qid, int) and not isinstance(qid, bool):
            qid = str(qid)
        if not isinstance(qid, str) or not qid.strip() or any(c.isspace() for c in qid.strip()):
            raise DataFormatError(path, where, f"needs a query id without spaces in one of {', '.join(ID_FIELDS)}, got {qid!r}")
        if not isinstance(text, str):
            raise DataFormatError(path, where, f"needs a query text (a string) in one of {', '.join(TEXT_FIELDS)}")
        yield where, qid.strip(), text
