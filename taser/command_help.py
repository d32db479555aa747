"""A command's `--help`: what it does (its module's docstring), then each setting with its default and
its meaning, read from the typed schema (a field's trailing comment in the dataclass) and the config
groups that can be chosen (`model=taser`). Hydra's own help stays at `--hydra-help`."""

from __future__ import annotations

import dataclasses
import inspect
import io
import tokenize
from pathlib import Path

from taser.override_check import _field_types, _next_schema, _schema_of


def field_comments(schema: type) -> dict[str, str]:
    """{field: its trailing comment} of a dataclass's source (`name: type = default  # meaning`)."""
    comments: dict[str, str] = {}
    for cls in reversed(schema.__mro__):
        if not dataclasses.is_dataclass(cls):
            continue
        try:
            source = inspect.getsource(cls)
        except (OSError, TypeError):
            continue
        names = {f.name for f in dataclasses.fields(cls)}
        line_name: dict[int, str] = {}
        for number, line in enumerate(source.splitlines(), start=1):
            head = line.strip().split(":", 1)[0]
            if ":" in line and head in names and line.startswith("    ") and not line.startswith("     "):
                line_name[number] = head
        above: dict[int, list[str]] = {}  # a comment on its own line(s) right above a field: that field's meaning
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type != tokenize.COMMENT:
                continue
            text = token.string.lstrip("# ").strip()
            if token.start[0] in line_name:
                comments.setdefault(line_name[token.start[0]], text)
            elif token.line.strip().startswith("#"):
                above.setdefault(token.start[0] + 1, []).append(text)
                if token.start[0] in above:  # a comment of several lines: carried down to the line after its last
                    above[token.start[0] + 1] = above.pop(token.start[0]) + above[token.start[0] + 1]
        for number, texts in above.items():
            if number in line_name:
                comments.setdefault(line_name[number], " ".join(texts))
    return comments


def _value(composed, key: str) -> str:
    """The setting's value in the composed config (the YAML's and the command line's), as it would be typed."""
    from omegaconf import OmegaConf

    try:
        node = OmegaConf.select(composed, key, throw_on_missing=True)
    except Exception:  # noqa: BLE001 (a missing value: the user must give it)
        return "???"
    if OmegaConf.is_config(node):
        return "{...}" if OmegaConf.is_dict(node) else str(OmegaConf.to_container(node, resolve=False))
    return "null" if node is None else str(getattr(node, "value", node))


def setting_lines(schema: type, composed, prefix: str = "", depth: int = 2) -> list[str]:
    """`key=value  meaning` for each setting, nested dataclasses (`train.batch_size`) to `depth` levels."""
    lines, comments, types = [], field_comments(schema), _field_types(schema)
    for field in dataclasses.fields(schema):
        inner, keyed = _next_schema(types[field.name])
        meaning = comments.get(field.name, "")
        if inner is not None and not keyed and depth > 1:
            lines.append(f"  {prefix}{field.name}.*: {meaning or inner.__name__ + ' settings'}")
            lines += setting_lines(inner, composed, f"{prefix}{field.name}.", depth - 1)
            continue
        shown = f"  {prefix}{field.name}={_value(composed, prefix + field.name)}"
        lines.append(f"{shown:<44}  {meaning}".rstrip() if meaning else shown)
    return lines


def _composed(config_dir: str, config_name: str, overrides: list[str]):
    from hydra import compose, initialize_config_dir

    try:
        with initialize_config_dir(config_dir=config_dir, version_base="1.3"):
            return compose(config_name, overrides=overrides)
    except Exception:  # noqa: BLE001 (help shows the schema's defaults when the command line does not compose)
        with initialize_config_dir(config_dir=config_dir, version_base="1.3"):
            return compose(config_name)


def help_text(config_dir: str, config_name: str, command: str, doc: str | None, overrides: list[str] | None = None) -> str:
    """The help of a command; `overrides`: the command line's other settings, shown as they would apply."""
    import yaml

    config = Path(config_dir)
    schema = _schema_of(config, config_name)
    header = ((yaml.safe_load((config / f"{config_name}.yaml").read_text(encoding="utf-8")) or {}).get("hydra") or {}).get("help", {}).get("header")
    parts = [header.strip() if header else f"{command}: {(doc or '').strip()}", "", "Settings (key=value on the command line; ??? must be given):"]
    composed = _composed(config_dir, config_name, [o for o in overrides or [] if "=" in o and not o.startswith("-")])
    parts += setting_lines(schema, composed) if schema is not None else ["  (see the config)"]
    groups = sorted(p.name for p in config.iterdir() if p.is_dir() and schema is not None and p.name in {f.name for f in dataclasses.fields(schema)})
    if groups:
        parts += ["", "Choices (group=option):"]
        parts += [f"  {g}: {', '.join(sorted(p.stem for p in (config / g).glob('*.yaml')))}" for g in groups]
    parts += ["", f"The config: {config / (config_name + '.yaml')}; Hydra's own options: {command} --hydra-help"]
    return "\n".join(parts)


def print_help_if_asked(config_dir: str, config_name: str, command: str, doc: str | None, argv: list[str]) -> None:
    """`--help` (or `-h`): the command's help, then exit 0."""
    if "--help" in argv or "-h" in argv:
        print(help_text(config_dir, config_name, command, doc, argv))
        raise SystemExit(0)


def run_command(main, config_name: str, doc: str | None) -> None:
    """A console command's entry: `--help` answered from the schema, mistyped keys refused, then the Hydra job `main`."""
    import sys

    from taser.override_check import check_overrides
    from taser.shipped import CONFIG_DIR

    print_help_if_asked(CONFIG_DIR, config_name, "taser-" + config_name.replace("_", "-"), doc, sys.argv[1:])
    check_overrides(CONFIG_DIR, config_name)
    main()
