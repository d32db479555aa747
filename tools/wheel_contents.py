"""What a wheel holds, by part: `python tools/wheel_contents.py dist/taser_retrieval-0.1.0-py3-none-any.whl`
(`make wheel` runs it). The README's "What the wheel holds" table is this output; tests/test_wheel.py
checks the table against a fresh build."""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

PARTS = [  # (what, path prefix in the wheel)
    ("the library (`taser/`, its commands included)", "taser/"),
    ("its Hydra configs (`taser/configs/`, from `configs/`)", "taser/configs/"),
    ("the shipped SQuAD data (`taser/data_files/`, from `data/`)", "taser/data_files/"),
    ("the table sweeper (`hydra_plugins/`)", "hydra_plugins/"),
    ("metadata (`*.dist-info/`)", ""),
]


def part_of(name: str) -> str:
    """The most specific part whose prefix `name` starts with."""
    matches = [(len(prefix), what) for what, prefix in PARTS if prefix and name.startswith(prefix)]
    return max(matches)[1] if matches else PARTS[-1][0]


def contents(wheel: Path) -> dict:
    sizes: dict[str, list[int]] = {what: [0, 0] for what, _ in PARTS}
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            if not info.is_dir():
                part = sizes[part_of(info.filename)]
                part[0] += 1
                part[1] += info.file_size
    return {"wheel": wheel.name, "bytes": wheel.stat().st_size, "parts": sizes}


def table(found: dict) -> str:
    rows = [f"| {what} | {files} | {size / 1e6:.2f} MB |" for what, (files, size) in found["parts"].items()]
    total = sum(size for _, size in found["parts"].values())
    return "\n".join([f"`{found['wheel']}`: {found['bytes'] / 1e6:.2f} MB, {total / 1e6:.2f} MB unpacked.", "",
                      "| part | files | unpacked |", "|---|---|---|", *rows])


if __name__ == "__main__":
    print(table(contents(Path(sys.argv[1]))))
