"""TREC run files, as `trec_eval` (and `pytrec_eval.parse_run`) read them.

One line per retrieved document: `query-id Q0 doc-id rank score run-tag`, space-separated,
ranks from 1 in the order given (best first); scores written in full (repr), so that
re-reading the file ranks exactly as the run did. Ids must not hold whitespace.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from taser.io import atomic_open


def _check_id(value: str, what: str) -> str:
    if not value or any(c.isspace() for c in value):
        raise ValueError(f"{what} {value!r} cannot be written to a TREC run file (empty or holds whitespace)")
    return value


def write_trec_run(path: str | os.PathLike, run: Mapping[str, Sequence[tuple[str, float]]], tag: str = "taser") -> int:
    """Write `run` ({query id: [(doc id, score), ...] best first}) atomically; returns the line count."""
    _check_id(tag, "run tag")
    n = 0
    with atomic_open(path) as f:
        for qid, hits in run.items():
            _check_id(qid, "query id")
            for rank, (docid, score) in enumerate(hits, start=1):
                f.write(f"{qid} Q0 {_check_id(docid, 'document id')} {rank} {float(score)!r} {tag}\n")
                n += 1
    return n
