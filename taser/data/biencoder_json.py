"""DPR's bi-encoder training JSON: a list of records
`{"question", "answers", "positive_ctxs", "negative_ctxs", "hard_negative_ctxs"}`.

Real files are several GB (NQ train), so they are never loaded as Python objects. One pass
parses and checks each record and keeps only its byte offset and length; a record is parsed
again from disk when it is needed. Memory is 16 bytes per record.
"""

from __future__ import annotations

import codecs
import json
import os
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from taser.data.errors import DataFormatError
from taser.io import atomic_open

_CHUNK = 1 << 22
_MAX_RECORD = 1 << 26  # 64 MB: no real record comes near; bounds memory on broken input
_decoder = json.JSONDecoder()
_WS = " \t\r\n"


def check_record(record: Any, path, index: int, require_positive: bool = True) -> None:
    where = f"record {index}"
    if not isinstance(record, dict):
        raise DataFormatError(path, where, f"expected a JSON object, got {type(record).__name__}")
    q = record.get("question")
    if not isinstance(q, str) or not q.strip():
        raise DataFormatError(path, where, "missing or empty 'question'")
    answers = record.get("answers", [])
    if not isinstance(answers, list):
        raise DataFormatError(path, where, "'answers' must be a list")
    for key in ("positive_ctxs", "negative_ctxs", "hard_negative_ctxs"):
        ctxs = record.get(key, [])
        if not isinstance(ctxs, list):
            raise DataFormatError(path, where, f"'{key}' must be a list")
        for j, ctx in enumerate(ctxs):
            if not isinstance(ctx, dict) or not isinstance(ctx.get("text"), str):
                raise DataFormatError(path, f"{where}, {key}[{j}]", "a ctx must be an object with a 'text' string")
    if require_positive and not record.get("positive_ctxs"):
        raise DataFormatError(path, where, f"question {q[:60]!r} has no positive_ctxs")


def _scan(path) -> Iterator[tuple[int, int, Any]]:
    """Yield (byte offset, byte length, parsed record) for each element of the top-level list."""
    decode = codecs.getincrementaldecoder("utf-8")()
    with open(path, "rb") as f:
        buf, pos, byte_pos, eof = "", 0, 0, False

        def more() -> bool:
            nonlocal buf, pos, eof
            if eof:
                return False
            chunk = f.read(_CHUNK)
            eof = not chunk
            buf = buf[pos:] + decode.decode(chunk, final=eof)
            pos = 0
            return not eof or bool(buf)

        def skip_ws() -> str:
            nonlocal pos, byte_pos
            while True:
                start = pos
                while pos < len(buf) and buf[pos] in _WS:
                    pos += 1
                byte_pos += pos - start  # whitespace is ASCII
                if pos < len(buf):
                    return buf[pos]
                if not more():
                    return ""

        if skip_ws() != "[":
            raise DataFormatError(path, "byte 0", "expected a JSON list of records")
        pos += 1
        byte_pos += 1
        index = 0
        if skip_ws() == "]":
            return
        while True:
            while True:
                try:
                    record, end = _decoder.raw_decode(buf, pos)
                    break
                except json.JSONDecodeError as e:
                    if len(buf) - pos > _MAX_RECORD or not more():
                        raise DataFormatError(path, f"record {index} (byte {byte_pos})", f"malformed JSON: {e.msg}") from None
            length = len(buf[pos:end].encode("utf-8"))
            yield byte_pos, length, record
            byte_pos += length
            pos = end
            index += 1
            sep = skip_ws()
            if sep == "]":
                return
            if sep != ",":
                raise DataFormatError(path, f"after record {index - 1} (byte {byte_pos})", f"expected ',' or ']', got {sep or 'end of file'!r}")
            pos += 1
            byte_pos += 1
            skip_ws()


scan_records = _scan  # (byte offset, byte length, parsed record) of each record, in order


class BiEncoderJsonFile:
    """Random access to the records of a DPR bi-encoder JSON file without holding them in memory."""

    def __init__(self, path: str | os.PathLike, require_positive: bool = True):
        self.path = str(path)
        if not os.path.exists(self.path):
            raise FileNotFoundError(f"bi-encoder JSON not found: {self.path}")
        offsets, lengths = [], []
        for i, (off, length, record) in enumerate(_scan(self.path)):
            check_record(record, self.path, i, require_positive)
            offsets.append(off)
            lengths.append(length)
        self._offsets = np.asarray(offsets, dtype=np.int64)
        self._lengths = np.asarray(lengths, dtype=np.int64)
        self._fh = None
        self._pid = None

    def __len__(self) -> int:
        return len(self._offsets)

    def _file(self):
        if self._fh is None or self._pid != os.getpid():  # reopen after fork (data workers)
            self._fh = open(self.path, "rb")
            self._pid = os.getpid()
        return self._fh

    def __getitem__(self, i: int) -> dict:
        if not -len(self) <= i < len(self):
            raise IndexError(i)
        f = self._file()
        f.seek(int(self._offsets[i]))
        return json.loads(f.read(int(self._lengths[i])))

    def __iter__(self) -> Iterator[dict]:
        for i in range(len(self)):
            yield self[i]

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_fh"] = None
        return state


def write_biencoder_json(path: str | os.PathLike, records: Iterable[dict]) -> int:
    """Stream records into a DPR bi-encoder JSON list (atomically). Returns the count."""
    n = 0
    with atomic_open(path, "w") as f:
        f.write("[")
        for record in records:
            f.write(",\n" if n else "\n")
            f.write(json.dumps(record, ensure_ascii=False))  # json.dump uses the slow pure-Python encoder
            n += 1
        f.write("\n]\n")
    return n
