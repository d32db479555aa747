"""The elements of a file's top-level JSON array, decoded one at a time.

A retrieval JSON of NQ's training questions (58,880 questions x 100 passages with their texts) is
several GB of text and several times that as Python objects: `json.load` cannot hold it on a
usual machine, while one record at a time is a few hundred KB. The file is read in blocks and
each element decoded by `json.JSONDecoder.raw_decode`; errors name the line and column, as
`json.load`'s would.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

from taser.data.errors import DataFormatError

BLOCK = 1 << 20
_WHITESPACE = " \t\n\r"
_NUMBER = "0123456789.eE+-"


class _Reader:
    """A window on the file: `buf[pos:]` is what is not consumed yet; the lines and column before
    `buf` are kept so that errors name absolute positions."""

    def __init__(self, f, path):
        self.f, self.path = f, path
        self.buf, self.pos, self.eof = "", 0, False
        self.lines_before, self.column_before = 0, 0  # newlines before buf; characters since the last one

    def more(self, block: int | None = None) -> bool:
        """Read another block, dropping what is consumed; False at the end of the file."""
        data = "" if self.eof else self.f.read(block or BLOCK)
        if not data:  # the window stays as it is: positions found in it remain valid
            self.eof = True
            return False
        consumed = self.buf[: self.pos]
        newlines = consumed.count("\n")
        self.lines_before += newlines
        self.column_before = len(consumed) - consumed.rfind("\n") - 1 if newlines else self.column_before + len(consumed)
        self.buf, self.pos = self.buf[self.pos :] + data, 0
        return True

    def skip_whitespace(self) -> str:
        """The next character that is not whitespace ("" at the end of the file), not consumed."""
        while True:
            while self.pos < len(self.buf) and self.buf[self.pos] in _WHITESPACE:
                self.pos += 1
            if self.pos < len(self.buf) or not self.more():
                return self.buf[self.pos : self.pos + 1]

    def where(self, index: int) -> str:
        newlines = self.buf.count("\n", 0, index)
        column = index - self.buf.rfind("\n", 0, index) - 1 if newlines else self.column_before + index
        return f"line {self.lines_before + newlines + 1}, column {column + 1}"

    def error(self, index: int, message: str) -> DataFormatError:
        return DataFormatError(self.path, self.where(index), message)


def _may_continue(element: object, buf: str, end: int) -> bool:
    """Whether more text could still belong to the element just decoded: a number whose digits,
    point or exponent run to the window's end ("-0." of "-0.25", "12" of "125")."""
    if end == len(buf):
        return True
    return isinstance(element, (int, float)) and not isinstance(element, bool) and all(ch in _NUMBER for ch in buf[end:])


def iter_json_array(path: str | os.PathLike, what: str = "a JSON list") -> Iterator[object]:
    """Each element of the JSON array that is `path`'s whole content, in order."""
    decoder = json.JSONDecoder()
    with open(path, encoding="utf-8") as f:
        r = _Reader(f, path)
        first = r.skip_whitespace()
        if first != "[":
            if first == "":
                raise r.error(r.pos, "invalid JSON: the file is empty")
            if first == "{":
                raise DataFormatError(path, "top level", f"expected {what}, got a JSON object")
            raise DataFormatError(path, "top level", f"expected {what}, found {first!r} first")
        r.pos += 1
        expect_element = None  # None: an element or "]"; True: an element (after a comma)
        while True:
            c = r.skip_whitespace()
            if c == "":
                raise r.error(r.pos, "invalid JSON: the file ends inside the list")
            if c == "]" and expect_element is None:
                r.pos += 1
                break
            block = BLOCK
            while True:
                try:
                    element, end = decoder.raw_decode(r.buf, r.pos)
                except json.JSONDecodeError as e:
                    if r.more(block):
                        block *= 2  # an element longer than the window: read more before decoding again
                        continue
                    raise r.error(e.pos, f"invalid JSON: {e.msg}") from None
                if _may_continue(element, r.buf, end) and r.more(block):  # a number cut at the window's end decodes short
                    continue
                break
            r.pos = end
            yield element
            c = r.skip_whitespace()
            if c == ",":
                r.pos += 1
                expect_element = True
            elif c == "]":
                r.pos += 1
                break
            elif c == "":
                raise r.error(r.pos, "invalid JSON: the file ends inside the list")
            else:
                raise r.error(r.pos, "invalid JSON: expected ',' or ']' after an element")
        if r.skip_whitespace() != "":
            raise r.error(r.pos, "invalid JSON: text after the list")
