"""DPR's question-answer TSV (`nq-test.qa.csv`): `question<TAB>python-list-of-answers`, no header.

The answer column is a Python literal, parsed with `ast.literal_eval` (never `eval`). For
CuratedTREC each answer is a regular expression; that is decided at matching time.
"""

from __future__ import annotations

import ast
import csv
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from taser.data.errors import DataFormatError
from taser.io import atomic_open


@dataclass(frozen=True)
class QAPair:
    question: str
    answers: list[str] = field(default_factory=list)


def parse_answer_list(raw: str, path: str | os.PathLike, line: int) -> list[str]:
    try:
        answers = ast.literal_eval(raw.strip())
    except (ValueError, SyntaxError) as e:
        raise DataFormatError(path, f"line {line}", f"answer list is not a Python list literal ({e}): {raw[:80]!r}") from None
    if not isinstance(answers, (list, tuple)) or not all(isinstance(a, str) for a in answers):
        raise DataFormatError(path, f"line {line}", f"answers must be a list of strings, got {raw[:80]!r}")
    return list(answers)


def read_qa(path: str | os.PathLike) -> Iterator[QAPair]:
    if not os.path.exists(path):
        raise FileNotFoundError(f"questions file not found: {path}")
    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.reader(f, delimiter="\t")
        for row in reader:
            line = reader.line_num
            if not row:
                continue
            if len(row) < 2:
                raise DataFormatError(path, f"line {line}", "expected question<TAB>answer-list")
            question = row[0].strip()
            if not question:
                raise DataFormatError(path, f"line {line}", "empty question")
            yield QAPair(question, parse_answer_list(row[1], path, line))


def write_qa(path: str | os.PathLike, pairs: Iterable[QAPair]) -> int:
    n = 0
    with atomic_open(path, "w", newline="") as f:
        writer = csv.writer(f, delimiter="\t", lineterminator="\n")
        for qa in pairs:
            writer.writerow([qa.question, repr(list(qa.answers))])
            n += 1
    return n
