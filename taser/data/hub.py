"""Datasets from the Hugging Face hub (through `datasets`), or their local copies.

A split is named by a `HubSplit`: the dataset's `name`, its `config` and its `split`. The name is

- a hub name (`BeIR/scifact`, `Tevatron/wikipedia-nq`, `nq_open`): `datasets.load_dataset`,
  from the local cache when `HF_DATASETS_OFFLINE=1` (or `HF_HUB_OFFLINE=1`);
- a directory written by `Dataset.save_to_disk` or `DatasetDict.save_to_disk`:
  `datasets.load_from_disk` (a DatasetDict gives the split);
- a JSON or JSON-lines file: `load_dataset("json", data_files=...)`;
- a directory mirroring a hub repository: `<dir>/<config>/` when a config is named (then as
  above), or JSON data files of the split in it (`<split>.jsonl`, `<split>-*.jsonl`, `<split>/*.jsonl`,
  `.json` alike).

Whatever fails inside `datasets` (not cached while offline, no such dataset, config or split)
becomes a `HubDataError` naming the dataset, config and split and what to fetch; `datasets`'
own traceback stays out of the way.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

JSON_SUFFIXES = (".json", ".jsonl", ".json.gz", ".jsonl.gz")


@dataclass
class HubSplit:
    name: str = ""  # a hub name (Tevatron/wikipedia-nq), a save_to_disk directory, a JSON file, or a directory mirroring a hub repository
    config: str | None = None  # the dataset's configuration (BEIR: corpus, queries), if it has several
    split: str = "train"

    def __str__(self) -> str:
        return f"{self.name}" + (f" (config {self.config!r}, split {self.split!r})" if self.config else f" (split {self.split!r})")


class HubDataError(RuntimeError):
    """A dataset that cannot be loaded: the message names it and what to do."""


def offline() -> bool:
    import datasets

    return bool(datasets.config.HF_HUB_OFFLINE)


def fetch_command(spec: HubSplit) -> str:
    args = [repr(spec.name)] + ([repr(spec.config)] if spec.config else []) + [f"split={spec.split!r}"]
    return f"python -c \"import datasets; datasets.load_dataset({', '.join(args)})\""


def _is_saved(path: Path) -> bool:
    return (path / "dataset_dict.json").is_file() or (path / "state.json").is_file()


def _json_files(directory: Path, split: str) -> list[str]:
    found = []
    for suffix in JSON_SUFFIXES:
        found += [directory / f"{split}{suffix}"]
        found += sorted(directory.glob(f"{split}-*{suffix}")) + sorted((directory / split).glob(f"*{suffix}"))
    return [str(p) for p in dict.fromkeys(found) if p.is_file()]


def _from_disk(path: Path, spec: HubSplit):
    import datasets

    loaded = datasets.load_from_disk(str(path))
    if isinstance(loaded, datasets.DatasetDict):
        if spec.split not in loaded:
            raise HubDataError(f"{spec}: the saved DatasetDict {path} has no split {spec.split!r}; its splits: {', '.join(loaded)}")
        return loaded[spec.split]
    return loaded


def _from_json(files: list[str], spec: HubSplit, cache_dir: str | None):
    import datasets

    try:
        return datasets.load_dataset("json", data_files={spec.split: files}, split=spec.split, cache_dir=cache_dir)
    except Exception as e:  # noqa: BLE001 (the boundary with datasets: its error, shortened, names the file)
        raise HubDataError(f"{spec}: cannot read the JSON data files {files}: {type(e).__name__}: {_first_line(e)}") from None


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else ""


def _local(path: Path, spec: HubSplit, cache_dir: str | None):
    if path.is_file():
        if not path.name.endswith(JSON_SUFFIXES):
            raise HubDataError(f"{spec}: {path} is a file but not JSON ({', '.join(JSON_SUFFIXES)}); give a hub name, a save_to_disk directory or JSON")
        return _from_json([str(path)], spec, cache_dir)
    if _is_saved(path):
        return _from_disk(path, spec)
    if spec.config and (path / spec.config).is_dir():
        return _local(path / spec.config, HubSplit(str(path / spec.config), None, spec.split), cache_dir)
    files = _json_files(path, spec.split)
    if files:
        return _from_json(files, spec, cache_dir)
    looked = (f"{path / spec.config}/, " if spec.config else "") + f"{path}/{spec.split}.jsonl (or .json, {spec.split}-*.jsonl, {spec.split}/*.jsonl)"
    raise HubDataError(f"{spec}: {path} is neither a save_to_disk directory nor holds the split's JSON data files; looked for {looked}")


def load_split(spec: HubSplit, cache_dir: str | os.PathLike | None = None):
    """The split as a `datasets.Dataset` (memory-mapped Arrow; nothing is read into memory)."""
    if not spec.name:
        raise HubDataError("a hub dataset needs a name (a hub name, a save_to_disk directory or JSON data files)")
    cache = str(cache_dir) if cache_dir else None
    path = Path(spec.name).expanduser()
    if path.exists():
        return _local(path, spec, cache)
    if spec.name.startswith(("/", "./", "../", "~")) or spec.name.endswith(JSON_SUFFIXES):
        raise HubDataError(f"{spec}: no such file or directory: {path}")
    import datasets

    try:
        return datasets.load_dataset(spec.name, spec.config, split=spec.split, cache_dir=cache)
    except Exception as e:  # noqa: BLE001 (the boundary with datasets: every failure becomes one message)
        where = cache or datasets.config.HF_DATASETS_CACHE
        if offline():
            raise HubDataError(
                f"{spec} is not in the local datasets cache ({where}) and HF_DATASETS_OFFLINE / HF_HUB_OFFLINE is set, so it was not "
                f"downloaded. Fetch it where the hub can be reached, with the same cache (HF_DATASETS_CACHE or HF_HOME): {fetch_command(spec)}; "
                f"or save it there with Dataset.save_to_disk and give that directory as its name. ({type(e).__name__}: {_first_line(e)})"
            ) from None
        raise HubDataError(f"{spec} could not be loaded: {type(e).__name__}: {_first_line(e)}. Check the name, config and split "
                           f"(to fetch it: {fetch_command(spec)}).") from None


def require_columns(dataset, spec: HubSplit | str, columns: list[str], what: str) -> None:
    """HubDataError unless `dataset` has every column of `columns` (dotted: a struct's field)."""
    have = set(dataset.column_names)
    missing = [c for c in columns if c.split(".")[0] not in have]
    if missing:
        raise HubDataError(f"{spec}: {what} needs the column(s) {', '.join(missing)}; the dataset has {', '.join(dataset.column_names)}")
