"""JSON-lines files: one object per non-blank line, errors naming the file and the line."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

from taser.data.errors import DataFormatError
from taser.progress import progress

PROGRESS_LINES = 10_000  # lines between progress updates


def json_lines(path: str | os.PathLike, desc: str | None = None) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for each non-blank line of a JSON-lines file; `desc`: with a progress
    bar (with ETA) over its bytes under that name."""
    size = os.path.getsize(path)
    with open(path, encoding="utf-8") as f, progress(total=size, desc=desc, unit="B", unit_scale=True, enabled=desc is not None) as bar:
        for line_no, line in enumerate(f, start=1):
            if line_no % PROGRESS_LINES == 0:
                bar.update(f.buffer.tell() - bar.n)
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataFormatError(path, f"line {line_no}", f"invalid JSON ({e.msg} at column {e.colno})") from None
            if not isinstance(obj, dict):
                raise DataFormatError(path, f"line {line_no}", f"expected a JSON object, got {type(obj).__name__}")
            yield line_no, obj
        bar.update(size - bar.n)
