"""Per-question outcomes: the compact file every evaluation writes beside `results.json`, so that
two runs over the same questions can be compared question by question (`taser.evaluation.significance`).

`per_query.jsonl`, one JSON object a line, no texts:

- QA files and EntityQuestions: `{"id": ..., "rank": r}`, r the 1-based rank of the first passage
  that holds an answer (null: none in the retrieved list); a question is a hit at k when r <= k.
  A QA TSV has no ids: the id is the question's 0-based position in the file. EntityQuestions
  adds `"relation"` (its macro average weights each relation equally).
- BEIR: `{"id": query id, "nDCG@10": ..., "nDCG@100": ..., "Recall@10": ..., "Recall@100": ...,
  "MRR@10": ...}`, pytrec_eval's values for that query (the last is its reciprocal rank within the
  first 10); their means are the figures in `results.json`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from taser.data.errors import DataFormatError
from taser.data.jsonl import json_lines
from taser.io import atomic_open

PER_QUERY_FILE = "per_query.jsonl"


def qa_records(ids: Sequence[str], ranks: Sequence[int | None], relations: Sequence[str] | None = None) -> list[dict]:
    """The per-question records of a top-k evaluation."""
    if len(ids) != len(ranks) or (relations is not None and len(relations) != len(ids)):
        raise ValueError(f"{len(ids)} ids, {len(ranks)} ranks" + ("" if relations is None else f", {len(relations)} relations"))
    if relations is None:
        return [{"id": str(i), "rank": r} for i, r in zip(ids, ranks)]
    return [{"id": str(i), "relation": rel, "rank": r} for i, rel, r in zip(ids, relations, ranks)]


def beir_records(scores: dict[str, dict[str, float]]) -> list[dict]:
    """The per-query records of a BEIR evaluation: {query id: {metric: value}} in the qrels' order."""
    return [{"id": str(qid), **{m: round(float(v), 6) for m, v in values.items()}} for qid, values in scores.items()]


def write_per_query(path: str | os.PathLike, records: Iterable[dict]) -> Path:
    """The records, one compact JSON object a line, written atomically."""
    path = Path(path)
    with atomic_open(path) as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n")
    return path


def read_per_query(path: str | os.PathLike) -> list[dict]:
    path = Path(path)
    records = []
    for line_no, record in json_lines(path):
        if "id" not in record:
            raise DataFormatError(path, f"line {line_no}", "expected an object with an 'id'")
        records.append(record)
    ids = [r["id"] for r in records]
    if len(set(ids)) != len(ids):
        raise DataFormatError(path, "ids", "an id appears twice")
    return records


def metric_values(records: Sequence[dict], metric: str) -> np.ndarray:
    """Each question's outcome on a report metric, on the scale of `results.json`: "top-k" -> 100
    when its first hit is within the first k passages, else 0; a BEIR metric -> its value."""
    if metric.startswith("top-"):
        k = int(metric.removeprefix("top-"))
        return np.array([100.0 if r.get("rank") is not None and r["rank"] <= k else 0.0 for r in records])
    try:
        return np.array([float(r[metric]) for r in records])
    except KeyError:
        raise ValueError(f"per-query records hold no {metric!r} (they hold {sorted(records[0]) if records else []})") from None


def question_weights(records: Sequence[dict]) -> np.ndarray:
    """Each question's weight in the dataset's figure, summing to 1: equal, or, when the records
    name relations (EntityQuestions), 1 / (relations x that relation's questions): the macro average."""
    n = len(records)
    if not n:
        raise ValueError("no per-query records")
    if not all("relation" in r for r in records):
        return np.full(n, 1.0 / n)
    counts: dict[str, int] = {}
    for r in records:
        counts[r["relation"]] = counts.get(r["relation"], 0) + 1
    return np.array([1.0 / (len(counts) * counts[r["relation"]]) for r in records])
