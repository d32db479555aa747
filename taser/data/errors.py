"""One error type for bad input, always naming the file and the record or line."""

from __future__ import annotations

import os


class DataFormatError(ValueError):
    """Malformed input data. The message names the file, where in it, and what is wrong."""

    def __init__(self, path: str | os.PathLike, where: str, what: str):
        self.path = str(path)
        self.where = where
        self.what = what
        super().__init__(f"{self.path}, {where}: {what}")
