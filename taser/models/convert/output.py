"""Where a conversion writes: a new directory, filled in a temporary one renamed when complete;
and the `README.md` an export leaves in it, saying how the model reads its inputs."""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Iterator
from pathlib import Path

from taser.io import atomic_dir
from taser.models.convert.mapping import ConversionError
from taser.progress import progress

_BAR: contextvars.ContextVar = contextvars.ContextVar("conversion_bar", default=None)


@contextlib.contextmanager
def conversion_progress(desc: str, steps: int) -> Iterator[None]:
    """A progress bar over a conversion's `steps` (reading the source, mapping the tensors,
    writing the output), advanced by `step` from the code doing each."""
    with progress(total=steps, desc=desc, unit="step") as bar:
        token = _BAR.set(bar)
        try:
            yield
        finally:
            _BAR.reset(token)


def step(name: str) -> None:
    """One step of the conversion under way done (nothing outside `conversion_progress`)."""
    bar = _BAR.get()
    if bar is not None:
        bar.set_postfix_str(f"{name} done", refresh=False)
        bar.update()


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


QUESTION_RULE = "replace \u2019 (U+2019, the typographic apostrophe) with ' before tokenising, as DPR's readers do"


def write_readme(directory: Path, title: str, source, lines: list[str]) -> None:
    """`directory/README.md`: where the export came from and how its inputs must be prepared."""
    body = [f"# {title}", "", f"Exported by taser (`taser-convert-checkpoint`) from `{source}`.", "",
            "## Inputs, as the model was trained and evaluated", "", *[f"- {line}" for line in lines], ""]  # fmt: skip
    (directory / "README.md").write_text("\n".join(body), encoding="utf-8")
