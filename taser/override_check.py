"""A mistyped setting on the command line, answered with the closest valid one before Hydra reads
it (Hydra itself says only that the key is not in the config and suggests `+`, which adds it and
fails later): `taser-train train.batch_szie=8` -> "unknown setting train.batch_szie: did you mean
train.batch_size?", exit status 2.

Checked against the command's typed schema (the dataclass its YAML starts from), one dotted part at a
time while the part is a dataclass; a free-form mapping (a table's rows, a hub's options) and
Hydra's own settings (`hydra.`, `hydra/...`), additions (`+key`) and deletions (`~key`) are left to
Hydra."""

from __future__ import annotations

import dataclasses
import difflib
import sys
from pathlib import Path

import yaml


def _schema_of(config_dir: Path, config_name: str) -> type | None:
    """The dataclass a command's YAML starts from (its first `defaults` entry, a registered schema)."""
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    from taser.cli import register_schemas

    register_schemas()
    defaults = (yaml.safe_load((config_dir / f"{config_name}.yaml").read_text(encoding="utf-8")) or {}).get("defaults") or []
    name = next((entry for entry in defaults if isinstance(entry, str) and entry != "_self_"), None)
    if name is None:
        return None
    store = ConfigStore.instance()
    if f"{name}.yaml" not in store.repo:  # the GPU check's and the reader's schemas register with their own modules (which import torch)
        from taser.gpu_check.job import register_schema as register_gpu_check
        from taser.reader.config import register_schemas as register_reader

        register_gpu_check()
        register_reader()
    try:
        return OmegaConf.get_type(store.load(f"{name}.yaml").node)
    except Exception:  # noqa: BLE001 (not a registered schema: nothing to check against)
        return None


def _field_types(schema: type) -> dict[str, object]:
    import typing

    try:
        hints = typing.get_type_hints(schema)
    except Exception:  # noqa: BLE001
        hints = {}
    return {f.name: hints.get(f.name, f.type) for f in dataclasses.fields(schema)}


def _next_schema(annotation) -> tuple[type | None, bool]:
    """(the dataclass an annotation's value holds, whether a free mapping key comes first): `X` and `X | None` -> (X, False);
    `dict[str, X]` -> (X, True); anything else (a scalar, a list, a free mapping) -> (None, False): not checked further."""
    import collections.abc
    import types
    import typing

    if dataclasses.is_dataclass(annotation) and isinstance(annotation, type):
        return annotation, False
    options = typing.get_args(annotation) if typing.get_origin(annotation) in (typing.Union, types.UnionType) else (annotation,)
    for option in options:
        if dataclasses.is_dataclass(option) and isinstance(option, type):
            return option, False
        if typing.get_origin(option) in (dict, collections.abc.Mapping):
            value = typing.get_args(option)[-1] if typing.get_args(option) else None
            return (value, True) if dataclasses.is_dataclass(value) and isinstance(value, type) else (None, False)
    return None, False


def unknown_setting(key: str, schema: type, groups: set[str]) -> str | None:
    """Why `key` (dotted) is not a setting of `schema`, with the closest valid key; None when it is (or cannot be told)."""
    parts, current, walked, at = key.split("."), schema, [], 0
    while at < len(parts):
        part, fields = parts[at], _field_types(current)
        if part not in fields:
            if not walked and part in groups:
                return None
            close = difflib.get_close_matches(part, list(fields), n=1, cutoff=0.6)
            if close:
                return f"unknown setting {key}: did you mean {'.'.join([*walked, close[0]])}?"
            return f"unknown setting {key}: {'.'.join(walked) or 'the command'} has {', '.join(sorted(fields))}"
        walked.append(part)
        current, keyed = _next_schema(fields[part])
        if current is None:
            return None
        if keyed:  # a mapping's own key (a table's row name): any, then the value's settings
            at += 1
            if at >= len(parts):
                return None
            walked.append(parts[at])
        at += 1
    return None


def check_overrides(config_dir: str, config_name: str, argv: list[str] | None = None) -> None:
    """Exit 2 with one line per mistyped setting among the command line's overrides."""
    args = sys.argv[1:] if argv is None else argv
    keys = [a.split("=", 1)[0] for a in args if "=" in a and not a.startswith(("-", "+", "~", "hydra.", "hydra/"))]
    if not keys:
        return
    schema = _schema_of(Path(config_dir), config_name)
    if schema is None:
        return
    groups = {p.name for p in Path(config_dir).iterdir() if p.is_dir()}
    problems = [why for key in keys if (why := unknown_setting(key, schema, groups))]
    if problems:
        print("\n".join(f"Error: {why}" for why in problems), file=sys.stderr)
        sys.exit(2)
