"""Question sets and passage corpora from the hub (`taser.data.hub`), as the QA TSV and the
passages TSV give them.

A question set has a question column and an answers column (a list of strings; a dotted name
reaches into a struct: TriviaQA's `answer.aliases`), named by settings; `nq_open`'s are
`question` and `answer`. A corpus has an id column (Tevatron's `docid`, BEIR's `_id`), `text` and
`title`; it is written once as a passages TSV, which BM25, encoding and FAISS indexes read, and
reused while the dataset (its fingerprint) and the columns are the same.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from taser.data.errors import DataFormatError
from taser.data.hub import HubSplit, load_split, require_columns
from taser.data.passages import Passage, write_passages
from taser.data.qa import QAPair
from taser.io import atomic_open

log = logging.getLogger(__name__)


def _get(row: dict, dotted: str):
    value = row
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def hub_questions(dataset, where: str, question_column: str = "question", answers_column: str = "answer") -> list[QAPair]:
    """The questions of a `datasets.Dataset`, checked as `read_qa` checks a QA TSV's rows."""
    require_columns(dataset, where, [question_column, answers_column], "a question set")
    columns = sorted({question_column.split(".")[0], answers_column.split(".")[0]})
    pairs = []
    for i, row in enumerate(dataset.select_columns(columns)):
        question, answers = _get(row, question_column), _get(row, answers_column)
        if not isinstance(question, str) or not question.strip():
            raise DataFormatError(where, f"record {i}", f"empty or missing question ({question_column!r})")
        if isinstance(answers, str):
            answers = [answers]
        if not isinstance(answers, (list, tuple)) or not all(isinstance(a, str) for a in answers):
            raise DataFormatError(where, f"record {i}", f"answers ({answers_column!r}) must be a list of strings, got {answers!r:.80}")
        pairs.append(QAPair(question.strip(), list(answers)))
    return pairs


def load_questions(spec: HubSplit, question_column: str = "question", answers_column: str = "answer", cache_dir=None) -> list[QAPair]:
    return hub_questions(load_split(spec, cache_dir), str(spec), question_column, answers_column)


def hub_passages(dataset, where: str, id_column: str = "docid") -> Iterator[Passage]:
    """The corpus's rows as passages, checked as a passages TSV's rows (ids unique, a text)."""
    require_columns(dataset, where, [id_column, "text"], "a passage corpus")
    columns = [c for c in (id_column, "text", "title") if c in dataset.column_names]
    seen: set[str] = set()
    for i, row in enumerate(dataset.select_columns(columns)):
        pid, text = row[id_column], row["text"]
        pid = str(pid).strip() if pid is not None else ""
        if not pid:
            raise DataFormatError(where, f"record {i}", f"empty passage id ({id_column!r})")
        if pid in seen:
            raise DataFormatError(where, f"record {i}", f"duplicate passage id {pid!r}")
        seen.add(pid)
        if not isinstance(text, str) or not text.strip():
            raise DataFormatError(where, f"record {i}", f"passage {pid!r} has empty text")
        yield Passage(pid, text, row.get("title") or "")


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name.strip("/")).strip("._") or "dataset"


def hub_corpus_dir(spec: HubSplit, work_dir: str | os.PathLike) -> Path:
    """`<work_dir>/<dataset-config-split>`: where a hub corpus's passages TSV (and its BM25 index) go."""
    return Path(work_dir) / _safe("-".join(filter(None, (spec.name, spec.config, spec.split))))


def hub_passages_tsv(spec: HubSplit, work_dir: str | os.PathLike, id_column: str = "docid", cache_dir=None) -> Path:
    """`<work_dir>/<dataset>/passages.tsv`: the corpus as a passages TSV, written once and reused while
    the dataset's fingerprint and the id column are unchanged (`passages.json` records both)."""
    dataset = load_split(spec, cache_dir)
    out = hub_corpus_dir(spec, work_dir)
    tsv, stamp_file = out / "passages.tsv", out / "passages.json"
    stamp = {"dataset": spec.name, "config": spec.config, "split": spec.split, "fingerprint": dataset._fingerprint, "id_column": id_column,
             "rows": dataset.num_rows}
    if tsv.is_file() and stamp_file.is_file() and json.loads(stamp_file.read_text()).get("source") == stamp:
        return tsv
    out.mkdir(parents=True, exist_ok=True)
    log.info("writing %s as the passages TSV %s", spec, tsv)
    n = write_passages(tsv, hub_passages(dataset, str(spec), id_column))
    with atomic_open(stamp_file) as f:
        json.dump({"source": stamp, "passages": n}, f, indent=2)
    return tsv
