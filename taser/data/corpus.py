"""A corpus to search, in any of the formats researchers keep one in, as DPR's passages TSV (what
the encoders, indexes and BM25 read):

- a DPR passages TSV (`id<TAB>text<TAB>title`, with its header): read as it is;
- a JSON-lines file: one document a line, an id (`_id` or `id`), a text (`text` or `contents`, as
  pyserini's JSONL collections name it) and an optional `title`;
- a BEIR dataset directory (its `corpus.jsonl`)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

from taser.data.beir import beir_documents
from taser.data.jsonl import json_lines
from taser.data.passages import Passage, write_passages
from taser.io import atomic_open, file_stamp

ID_FIELDS = ("_id", "id")
TEXT_FIELDS = ("text", "contents")


def corpus_file(path: str | os.PathLike) -> tuple[str, Path]:
    """(kind, file) of a corpus: ("tsv", the TSV), ("jsonl", the file) or ("jsonl", a BEIR directory's corpus.jsonl)."""
    given = Path(path)
    if not given.exists():
        raise FileNotFoundError(f"corpus {given} does not exist")
    if given.is_dir():
        inner = given / "corpus.jsonl"
        if not inner.is_file():
            raise FileNotFoundError(f"corpus {given} is a directory without corpus.jsonl (a BEIR dataset directory holds one)")
        return "jsonl", inner
    if given.suffix in (".jsonl", ".json"):
        return "jsonl", given
    return "tsv", given


def jsonl_passages(path: Path, stats: dict | None = None) -> Iterator[Passage]:
    """The documents of a JSON-lines corpus (`_id`/`id`, `text`/`contents`, `title`), with BEIR's rules
    (ids unique; a document with only a title searched by its title; one with neither skipped)."""

    def rows():
        for line, obj in json_lines(path, desc=f"read {path.name}"):
            normal = dict(obj)
            for name in ID_FIELDS[1:]:
                if "_id" not in normal and name in normal:
                    normal["_id"] = normal[name]
            for name in TEXT_FIELDS[1:]:
                if "text" not in normal and name in normal:
                    normal["text"] = normal[name]
            yield f"line {line}", normal

    return beir_documents(rows(), path, stats)


def passages_tsv(corpus: str | os.PathLike, work_dir: str | os.PathLike) -> Path:
    """The corpus as a passages TSV: a TSV itself; a JSONL or BEIR corpus converted once into
    `work_dir/corpus/passages.tsv` and reused while the source file is unchanged."""
    kind, source = corpus_file(corpus)
    if kind == "tsv":
        return source
    out = Path(work_dir) / "corpus"
    tsv, record = out / "passages.tsv", out / "source.json"
    stamp = {"source": str(source.resolve()), "stamp": list(file_stamp(source))}
    if tsv.is_file() and record.is_file() and json.loads(record.read_text(encoding="utf-8")) == stamp:
        return tsv
    out.mkdir(parents=True, exist_ok=True)
    write_passages(tsv, jsonl_passages(source))  # atomic; the record after it, so a record never vouches for another source's TSV
    with atomic_open(record) as f:
        json.dump(stamp, f)
    return tsv
