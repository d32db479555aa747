"""BEIR datasets: `corpus.jsonl`, `queries.jsonl` and `qrels/<split>.tsv`.

corpus.jsonl: one JSON object per line with `_id`, `text` and (optional) `title`.
queries.jsonl: one JSON object per line with `_id` and `text`.
qrels: tab-separated `query-id  corpus-id  score` with that header line; scores are integers.

As BEIR's own loader does, the queries of a split are those its qrels name (a query of
`queries.jsonl` without judgements is not evaluated). The corpus is converted once into a DPR
passages TSV (`write_beir_passages`), so that BM25, encoding and FAISS indexes read it like any
other corpus.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from taser.data.errors import DataFormatError
from taser.data.jsonl import json_lines
from taser.data.passages import Passage, write_passages

QRELS_HEADER = ["query-id", "corpus-id", "score"]


def _exists(path: str | os.PathLike, what: str) -> None:
    if not os.path.exists(path):
        raise FileNotFoundError(f"BEIR {what} file not found: {path}")


def _id(obj: dict, path: str | os.PathLike, where: str) -> str:
    value = obj.get("_id")
    if value is None:
        raise DataFormatError(path, where, "missing field '_id'")
    # Some BEIR-style files carry numeric ids; ids are strings everywhere else.
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or not value.strip():
        raise DataFormatError(path, where, f"'_id' must be a non-empty string, got {value!r}")
    return value


def _text_field(obj: dict, name: str, path: str | os.PathLike, where: str, required: bool = True) -> str:
    if name not in obj:
        if required:
            raise DataFormatError(path, where, f"missing field {name!r}")
        return ""
    value = obj[name]
    if value is None and not required:
        return ""
    if not isinstance(value, str):
        raise DataFormatError(path, where, f"field {name!r} must be a string, got {type(value).__name__}")
    return value


def read_beir_corpus(path: str | os.PathLike) -> Iterator[Passage]:
    """Stream the documents of a BEIR `corpus.jsonl` as passages (title may be empty)."""
    _exists(path, "corpus")
    for line_no, obj in json_lines(path):
        yield Passage(
            _id(obj, path, f"line {line_no}"),
            _text_field(obj, "text", path, f"line {line_no}"),
            _text_field(obj, "title", path, f"line {line_no}", required=False),
        )


def read_beir_queries(path: str | os.PathLike) -> dict[str, str]:
    """{query id: query text} from a BEIR `queries.jsonl`."""
    _exists(path, "queries")
    return beir_queries(((f"line {line_no}", obj) for line_no, obj in json_lines(path)), path)


def beir_queries(rows: Iterable[tuple[str, dict]], source) -> dict[str, str]:
    """{query id: query text} from (where, object) pairs of a queries file or dataset (`source`)."""
    queries: dict[str, str] = {}
    for where, obj in rows:
        qid = _id(obj, source, where)
        if qid in queries:
            raise DataFormatError(source, where, f"duplicate query id {qid!r}")
        queries[qid] = _text_field(obj, "text", source, where)
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


@dataclass(frozen=True)
class BeirFiles:
    corpus: Path
    queries: Path
    qrels: Path

    @property
    def name(self) -> str:
        """The dataset's name: its directory's (`scifact`, `nfcorpus`, ...)."""
        return self.corpus.resolve().parent.name


def beir_files(directory: str | os.PathLike, split: str = "test") -> BeirFiles:
    """The three files of a BEIR dataset directory, checked to exist."""
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"BEIR dataset directory not found: {directory}")
    files = BeirFiles(directory / "corpus.jsonl", directory / "queries.jsonl", directory / "qrels" / f"{split}.tsv")
    for what, path in (("corpus", files.corpus), ("queries", files.queries), (f"qrels ({split} split)", files.qrels)):
        if not path.is_file():
            raise FileNotFoundError(f"BEIR {what} file not found: {path}")
    return files


def read_beir_split(files: BeirFiles) -> tuple[dict[str, str], dict[str, dict[str, int]]]:
    """(queries, qrels) of a split: the queries its qrels judge, in the qrels' order.

    A query id of the qrels that `queries.jsonl` lacks is an error naming both files.
    """
    qrels = read_beir_qrels(files.qrels)
    return judged_queries(qrels, read_beir_queries(files.queries), files.qrels, files.queries)


def judged_queries(qrels: dict[str, dict[str, int]], all_queries: dict[str, str], qrels_source, queries_source) -> tuple[dict, dict]:
    """(queries, qrels): the queries the qrels judge, in the qrels' order; every judged id must be a query."""
    if not qrels:
        raise DataFormatError(qrels_source, "line 2", "no judgements after the header")
    missing = [qid for qid in qrels if qid not in all_queries]
    if missing:
        shown = ", ".join(repr(q) for q in missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise DataFormatError(qrels_source, "query-id column", f"{len(missing)} query id(s) not in {queries_source}: {shown}")
    return {qid: all_queries[qid] for qid in qrels}, qrels


def beir_passages(corpus: str | os.PathLike, stats: dict | None = None) -> Iterator[Passage]:
    """The corpus as passages for a passages TSV (`beir_documents`' rules)."""
    _exists(corpus, "corpus")
    rows = ((f"line {line_no}", obj) for line_no, obj in json_lines(corpus, desc=f"read {Path(corpus).name}"))
    return beir_documents(rows, corpus, stats)


def beir_documents(rows: Iterable[tuple[str, dict]], source, stats: dict | None = None) -> Iterator[Passage]:
    """Passages of (where, document) pairs of a corpus file or dataset (`source`). Document ids must be unique.

    A document with an empty text but a title is kept with its title as its text (DPR's TSV
    needs a text); one with neither is skipped. `stats` (if given) counts both.
    """
    stats = stats if stats is not None else {}
    stats.update(documents=0, title_as_text=0, skipped_empty=0)
    seen: set[str] = set()
    for where, obj in rows:
        p = Passage(_id(obj, source, where), _text_field(obj, "text", source, where), _text_field(obj, "title", source, where, required=False))
        if p.id in seen:
            raise DataFormatError(source, where, f"duplicate document id {p.id!r}")
        seen.add(p.id)
        if p.text.strip():
            stats["documents"] += 1
            yield p
        elif p.title.strip():
            stats["documents"] += 1
            stats["title_as_text"] += 1
            yield Passage(p.id, p.title, "")
        else:
            stats["skipped_empty"] += 1
    if not stats["documents"]:
        raise DataFormatError(source, "top level", "no document with a text or a title")


def write_beir_passages(corpus: str | os.PathLike, passages_tsv: str | os.PathLike) -> dict:
    """Convert `corpus.jsonl` into a passages TSV (atomically); returns the counts of `beir_passages`."""
    stats: dict = {}
    write_passages(passages_tsv, beir_passages(corpus, stats))
    return stats
