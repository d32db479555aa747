"""Where a conversion writes: a new directory, filled in a temporary one renamed when complete."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from taser.io import atomic_dir
from taser.models.convert.mapping import ConversionError


def check_output(output: str | os.PathLike, overwrite: bool = False, sources: tuple = ()) -> Path:
    """`output` as a Path, refused if it exists (unless `overwrite`) or is one of `sources`."""
    output = Path(output)
    for source in sources:
        if source is not None and Path(source).exists() and output.exists() and output.resolve() == Path(source).resolve():
            raise ConversionError(f"output {output} is the conversion's own source: choose another output")
    if output.exists() and not overwrite:
        raise ConversionError(f"output {output} exists: choose another output, or pass overwrite=true to replace it")
    return output


@contextlib.contextmanager
def output_dir(output: str | os.PathLike, overwrite: bool = False) -> Iterator[Path]:
    """A temporary directory that becomes `output` when the block succeeds (nothing otherwise)."""
    with atomic_dir(check_output(output, overwrite)) as tmp:
        yield tmp
