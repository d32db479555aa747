"""DPR's retrieval output: a JSON list of `{"question", "answers", "ctxs"}` records.

Each ctx is `{"id", "title", "text", "score", "has_answer"}`. The writer streams records
one at a time (a run over thousands of questions x 100 passages need not sit in memory) and
produces the same text as `json.dump(records, indent=4)`; `iter_retrieval_results` reads them
back one at a time (`taser.data.json_stream`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from typing import Any

from taser.data.errors import DataFormatError
from taser.data.json_stream import iter_json_array
from taser.io import atomic_open

RECORD_KEYS = ("question", "answers", "ctxs")
_INDENT = 4


def _plain(value: Any) -> Any:
    """JSON fallback for numpy/torch scalars (e.g. float32 scores from FAISS)."""
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def write_retrieval_results(path: str | os.PathLike, records: Iterable[dict]) -> int:
    """Write retrieval records as DPR's JSON list, atomically. Returns the number written."""
    pad = " " * _INDENT
    n = 0
    with atomic_open(path, "w") as f:
        f.write("[")
        for record in records:
            if not isinstance(record, dict) or any(k not in record for k in RECORD_KEYS):
                raise ValueError(f"retrieval record {n} must be a dict with keys {list(RECORD_KEYS)}")
            text = json.dumps(record, indent=_INDENT, ensure_ascii=False, default=_plain)
            # JSON strings hold no raw newlines, so this indents the record's lines only.
            f.write(("," if n else "") + "\n" + pad + text.replace("\n", "\n" + pad))
            n += 1
        f.write("\n]\n" if n else "]\n")
    return n


def _check_record(record: Any, path: str | os.PathLike, i: int) -> None:
    where = f"record {i}"
    if not isinstance(record, dict):
        raise DataFormatError(path, where, f"expected a JSON object, got {type(record).__name__}")
    missing = [k for k in RECORD_KEYS if k not in record]
    if missing:
        raise DataFormatError(path, where, f"missing field(s) {missing}")
    if not isinstance(record["answers"], list):
        raise DataFormatError(path, where, "'answers' must be a list")
    if not isinstance(record["ctxs"], list):
        raise DataFormatError(path, where, "'ctxs' must be a list")
    for j, ctx in enumerate(record["ctxs"]):
        if not isinstance(ctx, dict) or "id" not in ctx:
            raise DataFormatError(path, f"{where}, ctx {j}", "expected an object with an 'id'")


def iter_retrieval_results(path: str | os.PathLike) -> Iterator[dict]:
    """The checked records of a DPR retrieval JSON file, one at a time (the file is never held whole)."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"retrieval results file not found: {path}")
    for i, record in enumerate(iter_json_array(path, "a JSON list of records")):
        _check_record(record, path, i)
        yield record


def read_retrieval_results(path: str | os.PathLike) -> list[dict]:
    """Load and check a DPR retrieval JSON file."""
    return list(iter_retrieval_results(path))
