"""The passage corpus TSV of DPR (`psgs_w100.tsv`): header `id<TAB>text<TAB>title`.

DPR's files are csv-quoted (a `"` inside a field is doubled), so they are read with the `csv`
module rather than by splitting on tabs.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from taser.data.errors import DataFormatError
from taser.io import atomic_open
from taser.progress import progress

HEADER = ["id", "text", "title"]


@dataclass(frozen=True)
class Passage:
    id: str
    text: str
    title: str = ""


def same_passage(a: dict, b: dict) -> bool:
    """Two bi-encoder contexts (`{"title", "text", "passage_id"}`) are one passage: the same `passage_id`
    where both have one, else the same text (DPR's files give some positives no id)."""
    a_id, b_id = a.get("passage_id"), b.get("passage_id")
    if a_id not in (None, "") and b_id not in (None, ""):
        return str(a_id) == str(b_id)
    return (a.get("text") or "").strip() == (b.get("text") or "").strip()


def check_header(header: list[str] | None, path) -> None:
    """DataFormatError unless `header` (the first row, None for an empty file) is id<TAB>text<TAB>title."""
    if header is None:
        raise DataFormatError(path, "line 1", "empty file; expected the header id<TAB>text<TAB>title")
    if [h.strip().lower() for h in header[:3]] != HEADER:
        raise DataFormatError(path, "line 1", f"expected the header id<TAB>text<TAB>title, got {header!r}")


def row_to_passage(row: list[str], path, line: int) -> Passage:
    """The passage of a non-empty data row (line `line` of `path`), after checking it."""
    if len(row) < 2:
        raise DataFormatError(path, f"line {line}", f"expected 3 tab-separated fields, got {len(row)}")
    pid, text = row[0].strip(), row[1]
    if not pid:
        raise DataFormatError(path, f"line {line}", "empty passage id")
    if not text.strip():
        raise DataFormatError(path, f"line {line}", f"passage {pid!r} has empty text")
    return Passage(pid, text, row[2] if len(row) > 2 else "")


def read_passages(path: str | os.PathLike, progress: bool = False, desc: str = "read passages") -> Iterator[Passage]:
    """Stream the passages of a DPR passages TSV, checking every row.

    `progress`: a bar (with ETA) over the file's bytes, for a stage whose pace is the reading
    (indexing a large corpus)."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"passages file not found: {path}")
    size = os.path.getsize(path)
    with open(path, encoding="utf-8", newline="") as f, bar_over(size, desc, progress) as bar:
        reader = csv.reader(f, delimiter="\t")
        check_header(next(reader, None), path)
        for n, row in enumerate(reader, 1):
            if row:
                yield row_to_passage(row, path, reader.line_num)
            if n % PROGRESS_ROWS == 0:
                bar.update(f.buffer.tell() - bar.n)  # bytes consumed (ahead by at most the read buffer)
        bar.update(size - bar.n)


PROGRESS_ROWS = 10_000  # rows between progress updates


def bar_over(size: int, desc: str, enabled: bool):
    return progress(total=size, desc=desc, unit="B", unit_scale=True, enabled=enabled)


def write_passages(path: str | os.PathLike, passages: Iterable[Passage]) -> int:
    """Write passages as a DPR passages TSV (atomically). Returns the number written."""
    n = 0
    with atomic_open(path, "w", newline="") as f:
        writer = csv.writer(f, delimiter="\t", lineterminator="\n")
        writer.writerow(HEADER)
        for p in passages:
            writer.writerow([p.id, p.text, p.title])
            n += 1
    return n
