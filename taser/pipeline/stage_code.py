"""Each stage kind's recipe version: the code in a stage's key.

A stage's key holds its settings, its inputs and `version(kind)`, a number recorded in
`stage_code.json` beside this file together with a hash of the code that builds that kind of
stage (`CODE` below: the modules a stage kind runs, with every `taser` module they import, at any
depth, or run by name (`python -m taser.pipeline.encode_worker` under torchrun), plus the modules
that call them). When that code changes, the suite fails
(`tests/test_stage_keys.py`) until the change is recorded, one of two ways:

    python -m taser.pipeline.stage_code bump train     # the change can alter the stage's output: a new version, new keys, rebuilt stages
    python -m taser.pipeline.stage_code keep train     # it cannot (a refactor, a log line): same version, stages kept
    python -m taser.pipeline.stage_code check          # what changed, kind by kind

The hash is of the code's syntax tree without docstrings (`ast.unparse`), so comments, docstrings
and formatting never ask for a decision. Syntax trees can print differently under another Python
minor version: the check compares only under the version the table was recorded with.
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
import sys
from functools import cache
from importlib.util import find_spec
from pathlib import Path

TABLE = Path(__file__).with_name("stage_code.json")
PACKAGE_ROOT = Path(__file__).resolve().parent.parent  # taser/

# kind -> (modules whose taser imports are followed, modules taken alone: the callers that pass the stage its arguments)
CODE: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "squad": (("taser.data.squad",), ("taser.pipeline.rows",)),
    "qa-subset": (("taser.data.qa",), ("taser.pipeline.rows",)),
    "passages-subset": (("taser.data.passages",), ("taser.pipeline.rows",)),
    "bm25-index": (("taser.retrieval.bm25",), ("taser.pipeline.rows",)),
    "negatives-bm25": (("taser.pipeline.mine",), ("taser.pipeline.rows",)),
    "negatives-dense": (("taser.pipeline.mine",), ("taser.pipeline.rows",)),
    "train": (("taser.pipeline.train", "taser.pipeline.train_worker"), ("taser.pipeline.rows",)),
    "initial": (("taser.models.loading",), ("taser.pipeline.rows", "taser.pipeline.experiment")),
    "dense-index": (("taser.pipeline.evaluate",), ("taser.pipeline.rows",)),
    "evaluate": (("taser.pipeline.evaluate",), ("taser.pipeline.rows",)),
    "read": (("taser.pipeline.reader",), ("taser.pipeline.rows", "taser.pipeline.reader_stages")),
    "train-questions": (("taser.data.biencoder_json", "taser.data.qa"), ("taser.pipeline.rows", "taser.pipeline.reader_stages")),
    "retrieve-train": (("taser.pipeline.evaluate",), ("taser.pipeline.rows", "taser.pipeline.reader_stages")),
    "reader-reading": (("taser.pipeline.reader",), ("taser.pipeline.rows", "taser.pipeline.reader_stages")),
    "reader": (("taser.pipeline.reader",), ("taser.pipeline.rows", "taser.pipeline.reader_stages")),
}


def _file(module: str) -> Path | None:
    spec = find_spec(module)
    return Path(spec.origin) if spec is not None and spec.origin and spec.origin.endswith(".py") else None


def _module_exists(module: str) -> bool:
    parts = module.split(".")
    base = PACKAGE_ROOT.parent.joinpath(*parts)
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


@cache
def _tree(module: str) -> ast.Module:
    path = _file(module)
    if path is None:
        raise ValueError(f"stage code: no source file for module {module}")
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


_MODULE_NAME = re.compile(r"^taser(\.[A-Za-z_]\w*)+$")


def _imports(module: str) -> set[str]:
    """The taser modules `module` imports anywhere in its code (function-level imports too), or names
    in a string (a module started by name: `run_torchrun("taser.pipeline.encode_worker", ...)`)."""
    found = set()
    for node in ast.walk(_tree(module)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and _MODULE_NAME.match(node.value):
            found.add(node.value)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("taser.")}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and node.module.split(".")[0] == "taser":
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if _module_exists(sub) else node.module)
    return {m for m in found if _module_exists(m)}


def modules(kind: str) -> list[str]:
    """Every module whose code builds a stage of `kind`, sorted."""
    if kind not in CODE:
        raise KeyError(f"unknown stage kind {kind!r}; known: {', '.join(CODE)}")
    roots, alone = CODE[kind]
    seen, todo = set(), list(roots)
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo += sorted(_imports(module) - seen)
    return sorted(seen | set(alone))


def _without_docstrings(tree: ast.Module) -> ast.Module:
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body:
            first = body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                node.body = body[1:] or [ast.Pass()]
    return tree


def code_hash(kind: str) -> str:
    digest = hashlib.sha256()
    for module in modules(kind):
        tree = _without_docstrings(ast.parse(ast.unparse(_tree(module))))  # a copy: the cached tree stays whole
        digest.update(f"{module}\n{ast.unparse(tree)}\n".encode())
    return digest.hexdigest()


def python_minor() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def recorded() -> dict:
    return json.loads(TABLE.read_text())


def version(kind: str) -> int:
    """The recipe version of `kind` (part of every key of that kind)."""
    stages = recorded()["stages"]
    if kind not in stages:
        raise KeyError(f"stage kind {kind!r} has no recorded version in {TABLE}; known: {', '.join(stages)}")
    return int(stages[kind]["version"])


def changed() -> list[str]:
    """Kinds whose code differs from the recorded hash, or that have no record."""
    stages = recorded()["stages"]
    return [kind for kind in CODE if kind not in stages or stages[kind]["code"] != code_hash(kind)]


def record(kinds: list[str], bump: bool) -> dict:
    """Record the current code of `kinds`: with a new version (`bump`) or the same one."""
    table = recorded() if TABLE.is_file() else {"python": python_minor(), "stages": {}}
    for kind in kinds:
        old = table["stages"].get(kind, {"version": 0})
        table["stages"][kind] = {"version": old["version"] + 1 if bump or old["version"] == 0 else old["version"], "code": code_hash(kind),
                                 "modules": len(modules(kind))}
    table["python"] = python_minor()
    table["stages"] = dict(sorted(table["stages"].items()))
    TABLE.write_text(json.dumps(table, indent=2) + "\n")
    return table


def main(argv: list[str]) -> int:
    usage = "usage: python -m taser.pipeline.stage_code check | bump KIND... | keep KIND...  (kinds: " + ", ".join(CODE) + ")"
    if not argv or argv[0] not in ("check", "bump", "keep"):
        print(usage, file=sys.stderr)
        return 2
    if argv[0] == "check":
        kinds = changed()
        for kind in kinds:
            print(f"{kind}: code changed since version {recorded()['stages'].get(kind, {}).get('version', '-')} was recorded "
                  f"({len(modules(kind))} modules: {', '.join(modules(kind))})")
        print("every stage kind's code is as recorded" if not kinds else f"{len(kinds)} kind(s) to bump or keep")
        return 1 if kinds else 0
    kinds = argv[1:] or []
    unknown = [k for k in kinds if k not in CODE]
    if unknown or not kinds:
        print(f"name the stage kinds to {argv[0]}: " + (f"unknown {unknown}; " if unknown else "") + usage, file=sys.stderr)
        return 2
    table = record(kinds, bump=argv[0] == "bump")
    for kind in kinds:
        print(f"{kind}: version {table['stages'][kind]['version']} ({argv[0]})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
