"""EntityQuestions (Sciavolino et al. 2021): simple entity-centric questions, one file per
Wikidata relation.

The released layout is a directory per split (`dataset/test/`) holding one file per relation,
`<relation>.<split>.json` (a JSON list of `{"question", "answers"}`, as in the paper's download)
or `<relation>.<split>.jsonl` (one such object per line, the repository's current form), e.g.
`P17.test.json` for "Which country is X located in?". Answers are matched against passages with
DPR's string rule, like NQ's.
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path

from taser.data.errors import DataFormatError
from taser.data.jsonl import json_lines
from taser.data.qa import QAPair

log = logging.getLogger(__name__)

DATASET = "EntityQuestions"


def split_dir(directory: str | os.PathLike, split: str = "test") -> Path:
    """The directory holding the split's relation files: `directory` itself, or its `<split>/`."""
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"EntityQuestions directory not found: {directory}")
    if (directory / split).is_dir():
        return directory / split
    return directory


def relation_files(directory: str | os.PathLike, split: str = "test") -> dict[str, Path]:
    """{relation: file} of a split, sorted by relation; `.json` wins over a `.jsonl` twin."""
    folder = split_dir(directory, split)
    pattern = re.compile(rf"^(?P<relation>.+)\.{re.escape(split)}\.(?P<ext>jsonl?)$")
    found: dict[str, Path] = {}
    for path in sorted(folder.iterdir()):
        m = pattern.match(path.name)
        if not m or not path.is_file():
            continue
        relation = m.group("relation")
        if relation in found:
            if m.group("ext") == "json":
                log.info("%s: using %s, not %s", relation, path.name, found[relation].name)
                found[relation] = path
            continue
        found[relation] = path
    if not found:
        raise FileNotFoundError(f"no EntityQuestions files <relation>.{split}.json or .jsonl in {folder}")
    return dict(sorted(found.items(), key=lambda item: _relation_key(item[0])))


def _relation_key(relation: str) -> tuple:
    """P17 < P19 < P106: Wikidata ids by number, anything else after, by name."""
    m = re.fullmatch(r"P(\d+)", relation)
    return (0, int(m.group(1)), "") if m else (1, 0, relation)


def _record(obj, path: Path, where: str) -> QAPair:
    if not isinstance(obj, dict):
        raise DataFormatError(path, where, f"expected a JSON object, got {type(obj).__name__}")
    missing = [key for key in ("question", "answers") if key not in obj]
    if missing:
        raise DataFormatError(path, where, f"missing field(s) {missing}")
    question, answers = obj["question"], obj["answers"]
    if not isinstance(question, str) or not question.strip():
        raise DataFormatError(path, where, f"'question' must be a non-empty string, got {question!r}")
    if not isinstance(answers, list) or not answers or not all(isinstance(a, str) and a.strip() for a in answers):
        raise DataFormatError(path, where, f"'answers' must be a non-empty list of non-empty strings, got {answers!r}")
    return QAPair(question.strip(), list(answers))


def read_relation_file(path: str | os.PathLike) -> list[QAPair]:
    """The questions of one relation file (`.json`: a list; `.jsonl`: one object per line)."""
    path = Path(path)
    if path.suffix == ".jsonl":
        pairs = [_record(obj, path, f"line {line_no}") for line_no, obj in json_lines(path)]
    else:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise DataFormatError(path, f"line {e.lineno}, column {e.colno}", f"invalid JSON ({e.msg})") from None
        if not isinstance(data, list):
            raise DataFormatError(path, "top level", f"expected a JSON list of questions, got {type(data).__name__}")
        pairs = [_record(obj, path, f"record {i}") for i, obj in enumerate(data)]
    if not pairs:
        raise DataFormatError(path, "top level", "no questions")
    return pairs


def read_entity_questions(directory: str | os.PathLike, split: str = "test") -> dict[str, list[QAPair]]:
    """{relation: questions} of a split, relations in Wikidata order (P17, P19, ..., P800)."""
    return {relation: read_relation_file(path) for relation, path in relation_files(directory, split).items()}
