"""Training records from a memory-mapped Arrow dataset: a hub dataset (DPR's or Tevatron's layout),
or a DPR bi-encoder JSON converted once into an Arrow file and reused while the JSON is unchanged.

Every process (each DDP rank, each DataLoader worker) maps the same file: the records live in
the page cache once, shared, instead of in each process's memory. A record is read when it is
needed and given in DPR's shape (`question`, `answers`, `positive_ctxs`, `negative_ctxs`,
`hard_negative_ctxs`, each ctx with `title`, `text` and, where known, `passage_id`, `score`,
`title_score`): the same dict `BiEncoderJsonFile` gives for the same JSON record.

Layouts read:
- DPR's: the bi-encoder JSON's fields as columns.
- Tevatron's (`Tevatron/wikipedia-nq`, `-trivia`, ...): `query`, `answers` (optional),
  `positive_passages` and `negative_passages`, each passage `docid`, `title`, `text`. Its
  negatives are BM25's, so they become `hard_negative_ctxs` (`negative_ctxs` is empty) and
  `docid` becomes `passage_id`.

The checks are `check_record`'s (a question, ctxs with a text, a positive), made on whole columns
at open time, so that a bad record fails before training starts, naming the dataset and record.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

import numpy as np

from taser.data.biencoder_json import check_record, scan_records
from taser.data.errors import DataFormatError
from taser.io import atomic_open, file_stamp

log = logging.getLogger(__name__)

FORMAT_VERSION = 1  # of the converted files: a change of the schema below makes new cache keys
CTX_FIELDS = {"title": "string", "text": "string", "score": "float64", "title_score": "int64", "passage_id": "string"}
CTX_KEYS = ("positive_ctxs", "negative_ctxs", "hard_negative_ctxs")
BATCH_RECORDS = 5_000  # records per Arrow record batch while converting


def _passage(value):
    """A passage as a dict: `datasets` stores passages whose fields differ from row to row as JSON text."""
    return json.loads(value) if isinstance(value, str) else value


class Layout:
    """How a dataset's rows become DPR records, and the columns that say so."""

    name = ""
    question = ""
    ctx_columns: dict[str, str] = {}  # column -> the DPR key it becomes
    required_ctx = ""

    def record(self, row: dict) -> dict:
        raise NotImplementedError


class DprLayout(Layout):
    name, question = "DPR", "question"
    ctx_columns = {k: k for k in CTX_KEYS}
    required_ctx = "positive_ctxs"

    def record(self, row: dict) -> dict:
        out = {k: v for k, v in row.items() if v is not None}
        for key in CTX_KEYS:
            if key in out:
                out[key] = [{f: v for f, v in _passage(ctx).items() if v is not None} for ctx in out[key]]
        return out


class TevatronLayout(Layout):
    name, question = "Tevatron", "query"
    ctx_columns = {"positive_passages": "positive_ctxs", "negative_passages": "hard_negative_ctxs"}
    required_ctx = "positive_passages"

    @staticmethod
    def _ctx(p) -> dict:
        p = _passage(p)
        ctx = {"title": p.get("title") or "", "text": p["text"]}
        if p.get("docid") is not None:
            ctx["passage_id"] = str(p["docid"])
        return ctx

    def record(self, row: dict) -> dict:
        return {
            "question": row["query"],
            "answers": list(row.get("answers") or []),
            "positive_ctxs": [self._ctx(p) for p in row.get("positive_passages") or []],
            "negative_ctxs": [],
            "hard_negative_ctxs": [self._ctx(p) for p in row.get("negative_passages") or []],
        }


def detect_layout(columns: list[str], where: str) -> Layout:
    have = set(columns)
    if {"question", "positive_ctxs"} <= have:
        return DprLayout()
    if {"query", "positive_passages"} <= have:
        return TevatronLayout()
    raise DataFormatError(where, "columns", f"neither DPR's layout (question, positive_ctxs, ...) nor Tevatron's (query, positive_passages, "
                                           f"negative_passages); the dataset has {', '.join(columns)}")


def _first(mask) -> int | None:
    """The first row where a boolean array is true (null counts as true)."""
    import pyarrow.compute as pc

    hits = np.flatnonzero(np.asarray(pc.fill_null(mask, True)))
    return int(hits[0]) if len(hits) else None


def _is_list(t) -> bool:
    import pyarrow as pa

    return pa.types.is_list(t) or pa.types.is_large_list(t)


def _is_json(t) -> bool:
    import pyarrow as pa

    return isinstance(t, pa.BaseExtensionType) and t.extension_name == "arrow.json"


def _check_types(schema, layout: Layout, where: str) -> None:
    import pyarrow as pa

    q = schema.field(layout.question).type
    if not pa.types.is_string(q) and not pa.types.is_large_string(q):
        raise DataFormatError(where, f"column {layout.question!r}", f"must be strings, got {q}")
    if "answers" in schema.names:
        t = schema.field("answers").type
        if not pa.types.is_null(t) and not _is_list(t):
            raise DataFormatError(where, "column 'answers'", f"must be a list, got {t}")
    for column in layout.ctx_columns:
        if column not in schema.names or pa.types.is_null(t := schema.field(column).type):
            continue
        if not _is_list(t):
            raise DataFormatError(where, f"column {column!r}", f"must be a list of passages, got {t}")
        item = t.value_type
        if pa.types.is_null(item) or _is_json(item):
            continue
        if not pa.types.is_struct(item) or item.get_field_index("text") < 0 or not pa.types.is_string(item.field("text").type):
            raise DataFormatError(where, f"column {column!r}", f"a passage must have a 'text' string, got {item}")


def _check_passages(col, column: str, where: str, offset: int) -> None:
    """Every passage of a batch's passage column has a text."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if pa.types.is_null(col.type) or pa.types.is_null(col.type.value_type):
        return
    if _is_json(col.type.value_type):  # passages as JSON text (their fields differ between rows): checked one by one
        for row, ctxs in enumerate(col.to_pylist()):
            for ctx in map(_passage, ctxs or []):
                if not isinstance(ctx, dict) or not isinstance(ctx.get("text"), str):
                    raise DataFormatError(where, f"record {offset + row}, {column}", "a passage must have a 'text' string")
        return
    flat = pc.list_flatten(col)
    bad = _first(pc.or_(pc.is_null(flat), pc.is_null(pc.struct_field(flat, "text"))))
    if bad is not None:
        row = offset + int(np.asarray(pc.list_parent_indices(col))[bad])
        raise DataFormatError(where, f"record {row}, {column}", "a passage must have a 'text' string")


CHECK_ROWS = 20_000  # rows checked at a time: the temporaries stay small whatever the table's size


def check_table(table, layout: Layout, where: str, require_positive: bool = True) -> None:
    """`check_record`'s checks on every row, a block of rows at a time (pyarrow compute)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    _check_types(table.schema, layout, where)
    offset = 0
    for batch in table.to_batches(max_chunksize=CHECK_ROWS):
        q = batch.column(layout.question)
        bad = _first(pc.equal(pc.utf8_trim_whitespace(q), ""))
        if bad is not None:
            raise DataFormatError(where, f"record {offset + bad}", f"missing or empty {layout.question!r}")
        for column in layout.ctx_columns:
            if column in batch.schema.names:
                _check_passages(batch.column(column), column, where, offset)
        if require_positive:
            positives = batch.column(layout.required_ctx)
            if pa.types.is_null(positives.type):
                bad = 0 if batch.num_rows else None
            else:
                bad = _first(pc.less_equal(pc.fill_null(pc.list_value_length(positives), 0), 0))
            if bad is not None:
                question = q[bad].as_py()
                raise DataFormatError(where, f"record {offset + bad}", f"question {question[:60]!r} has no {layout.required_ctx}")
        offset += batch.num_rows
    pa.default_memory_pool().release_unused()  # the checks' temporaries: returned, not kept by the allocator in every rank


class ArrowTrainingSet:
    """Random access to DPR records in memory-mapped Arrow data (either layout): a `datasets.Dataset`
    (a hub dataset), or the path of an Arrow stream file (a converted JSON), mapped by pyarrow
    alone (no `datasets` import in each rank)."""

    def __init__(self, source, where: str, require_positive: bool = True):
        self.source, self.where = (str(source) if isinstance(source, (str, os.PathLike)) else source), where
        self._table = self._columns = None
        self.layout = detect_layout(self.table.column_names, where)
        check_table(self.table, self.layout, where, require_positive)

    @property
    def table(self):
        """The rows as one pyarrow Table, memory-mapped (mapped again after unpickling, in a worker)."""
        if self._table is None:
            if isinstance(self.source, str):
                import pyarrow as pa

                self._table = pa.ipc.open_stream(pa.memory_map(self.source)).read_all()  # zero-copy: buffers point into the map
            else:
                ds = self.source if self.source._indices is None else self.source.flatten_indices()
                self._table = ds.data.table
            self._columns = [(name, self._table.column(name)) for name in self._table.column_names]
        return self._table

    def __len__(self) -> int:
        return self.table.num_rows

    def __getitem__(self, i: int) -> dict:
        n = len(self)
        if not -n <= i < n:
            raise IndexError(i)
        i %= n
        return self.layout.record({name: column[i].as_py() for name, column in self._columns})

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_table"] = state["_columns"] = None  # a path (or a memory-mapped dataset, pickled as its files' paths) is mapped again
        return state


# --- a DPR bi-encoder JSON converted once into an Arrow file -------------------------------------


def arrow_cache_path(source: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> Path:
    """Where the Arrow copy of `source` lives: `<cache_dir or source's directory>/<name>.<key>.arrow`,
    the key a hash of the source's absolute path and its `file_stamp` (size, inode, modification and
    status-change times; and of this format's version): a changed source gets a new file, an
    unchanged one finds its copy."""
    src = Path(source).resolve()
    path_key = hashlib.sha256(str(src).encode()).hexdigest()[:8]
    state_key = hashlib.sha256(f"{file_stamp(src)[1:]}:{FORMAT_VERSION}".encode()).hexdigest()[:12]
    return Path(cache_dir or src.parent) / f"{src.name}.{path_key}-{state_key}.arrow"


def _ctx_schema():
    import pyarrow as pa

    return pa.struct([(name, getattr(pa, kind)()) for name, kind in CTX_FIELDS.items()])


def dpr_schema():
    import pyarrow as pa

    ctxs = pa.list_(_ctx_schema())
    return pa.schema([("question", pa.string()), ("answers", pa.list_(pa.string())),
                      ("positive_ctxs", ctxs), ("negative_ctxs", ctxs), ("hard_negative_ctxs", ctxs)])


def _number(value, kind, path, where: str, name: str):
    if value is None:
        return None
    if isinstance(value, bool):
        raise DataFormatError(path, where, f"{name!r} must be a number, got {value!r}")
    try:
        number = kind(value)
    except (TypeError, ValueError):
        raise DataFormatError(path, where, f"{name!r} must be a number, got {value!r}") from None
    if kind is int and number != value:
        raise DataFormatError(path, where, f"{name!r} must be an integer, got {value!r}")
    return number


def _arrow_row(record: dict, path, index: int, dropped: set[str]) -> dict:
    """`record` (checked by `check_record`) in the Arrow schema's types; keys outside it are noted in `dropped`."""
    where = f"record {index}"
    dropped.update(k for k in record if k not in ("question", "answers", *CTX_KEYS))
    answers = record.get("answers", [])
    if not all(isinstance(a, str) for a in answers):
        raise DataFormatError(path, where, f"answers must be strings, got {answers[:5]!r}")
    row = {"question": record["question"], "answers": answers}
    for key in CTX_KEYS:
        ctxs = []
        for j, ctx in enumerate(record.get(key, [])):
            at = f"{where}, {key}[{j}]"
            dropped.update(f"{key}[].{k}" for k in ctx if k not in CTX_FIELDS)
            title = ctx.get("title")
            if title is not None and not isinstance(title, str):
                raise DataFormatError(path, at, f"'title' must be a string, got {title!r}")
            pid = ctx.get("passage_id")
            ctxs.append({"title": title, "text": ctx["text"], "score": _number(ctx.get("score"), float, path, at, "score"),
                         "title_score": _number(ctx.get("title_score"), int, path, at, "title_score"),
                         "passage_id": None if pid is None else str(pid)})
        row[key] = ctxs
    return row


def convert_json_to_arrow(source: str | os.PathLike, dest: str | os.PathLike, require_positive: bool = True) -> int:
    """Write the records of a DPR bi-encoder JSON as an Arrow file (atomically), checking each as
    `BiEncoderJsonFile` does. Returns the count. Record keys outside DPR's (`dataset`, for one)
    are not kept: training reads none of them."""
    import pyarrow as pa

    schema, rows, dropped, n = dpr_schema(), [], set(), 0
    with atomic_open(dest, "wb") as f, pa.ipc.new_stream(f, schema) as writer:
        for i, (_, _, record) in enumerate(scan_records(source)):
            check_record(record, source, i, require_positive)
            rows.append(_arrow_row(record, source, i, dropped))
            n += 1
            if len(rows) == BATCH_RECORDS:
                writer.write_batch(pa.RecordBatch.from_pylist(rows, schema=schema))
                rows = []
        if rows or not n:
            writer.write_batch(pa.RecordBatch.from_pylist(rows, schema=schema))
    if dropped:
        log.info("%s: keys not kept in its Arrow copy (training reads none of them): %s", source, ", ".join(sorted(dropped)))
    return n


def stale_copies(source: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> list[Path]:
    """Arrow copies of `source` (same path) made from an earlier state of it."""
    current = arrow_cache_path(source, cache_dir)
    stem = current.name.rsplit("-", 1)[0]
    return [p for p in current.parent.glob(f"{stem}-*.arrow") if p != current]


def ensure_arrow_copy(source: str | os.PathLike, cache_dir: str | os.PathLike | None = None, require_positive: bool = True) -> Path:
    """The Arrow copy of `source`, converted now unless an up-to-date one exists (older copies removed)."""
    if not os.path.exists(source):
        raise FileNotFoundError(f"bi-encoder JSON not found: {source}")
    dest = arrow_cache_path(source, cache_dir)
    if dest.is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    log.info("converting %s into the Arrow file %s (once; reused while the JSON is unchanged)", source, dest)
    n = convert_json_to_arrow(source, dest, require_positive)
    log.info("%s: %d records", dest, n)
    for old in stale_copies(source, cache_dir):
        old.unlink(missing_ok=True)
    return dest


def open_arrow_file(path: str | os.PathLike, where: str | None = None, require_positive: bool = True) -> ArrowTrainingSet:
    """An Arrow file of training records (as `convert_json_to_arrow` writes, or `datasets` caches), memory-mapped."""
    return ArrowTrainingSet(Path(path), where or str(path), require_positive)
