"""Every `python scripts/<x>.py ...` (and `torchrun ... scripts/<x>.py ...`) command in the README,
the docs (fenced blocks and inline code spans), the scripts' own docstrings and the configs' header
comments is composed against the typed configs (Hydra compose, without running the job): a renamed
or mistyped setting fails here, naming the file and line. Under `-m`, a swept setting is composed
at its first value."""

from __future__ import annotations

import ast
import re
import shlex
from pathlib import Path

import pytest
from conftest import ROOT
from hydra import compose, initialize_config_dir

from taser.cli import CONFIG_DIR

# A command in any of its three spellings: `python scripts/train.py` (a clone), `taser-train` (the console command of
# an installed package), `python -m taser.train` (either); the name is the script's (`taser-build-index`: build_index).
SCRIPT = re.compile(r"(?:^|\s)(?:\S*/)?scripts/(\w+)\.py(?=\s|$)|(?:^|\s)-m taser\.(\w+)(?=\s|$)|(?:^|\s)(?:\S*/)?taser-([a-z][a-z-]*)(?=\s|$)")
CONFIG_NAME = re.compile(r'config_name="(\w+)"')


def script_name(m: re.Match) -> str:
    return m.group(1) or m.group(2) or m.group(3).replace("-", "_")


def command_modules() -> dict[str, Path]:
    """Script name -> the module that holds its command (taser/<name>.py; the GPU check's taser/gpu_check/__main__.py)."""
    found = {path.stem: ROOT / "taser" / f"{path.stem}.py" for path in (ROOT / "scripts").glob("*.py") if not path.name.startswith("_")}
    found["gpu_check"] = ROOT / "taser" / "gpu_check" / "__main__.py"
    return found


def hydra_scripts() -> dict[str, str]:
    """Script name -> its primary config's name, for the scripts that are Hydra apps."""
    found = {}
    for name, path in command_modules().items():
        m = CONFIG_NAME.search(path.read_text(encoding="utf-8"))
        if m:
            found[name] = m.group(1)
    return found


COMMAND_START = re.compile(r"^(\S*/)?(python3?|torchrun|taser-[a-z][a-z-]*)(\s|$)")  # `python`, `.venv/bin/python`, `torchrun`
INLINE_SPAN = re.compile(r"(?<!`)`([^`]+)`(?!`)")


def inline_commands(text: str, first_line: int = 1) -> list[tuple[int, str]]:
    """(line, command) of each inline code span holding a script command (a span may run over a
    line break, as markdown allows)."""
    found = []
    for m in INLINE_SPAN.finditer(text):
        command = " ".join(m.group(1).split())
        if COMMAND_START.match(command) and SCRIPT.search(command):
            found.append((first_line + text.count("\n", 0, m.start()), command))
    return found


def without_fences(text: str) -> str:
    """`text` with fenced blocks blanked (their lines kept, so line numbers hold)."""
    lines, fence = text.splitlines(), False
    for number, line in enumerate(lines):
        if line.strip().startswith("```"):
            fence = not fence
            lines[number] = ""
        elif fence:
            lines[number] = ""
    return "\n".join(lines)


def docstring_commands(path: Path) -> list[tuple[int, str]]:
    """(line, command) of each script command in a Python file's module docstring: inline spans and
    lines that start with one (a trailing `# remark` dropped, continued lines joined)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    doc = ast.get_docstring(tree, clean=False)
    if not doc:
        return []
    first = tree.body[0].lineno
    lines = [(first + offset, line.split("  #")[0].strip()) for offset, line in enumerate(doc.splitlines())]
    return inline_commands(doc, first) + joined_commands((n, t) for n, t in lines if "`" not in t)


def joined_commands(lines) -> list[tuple[int, str]]:
    """(line, command) of each script command among (line, text) pairs, continued lines joined."""
    found, pending, start = [], "", 0
    for number, text in lines:
        if pending:
            pending += " " + text.strip()
        elif SCRIPT.search(text) and COMMAND_START.match(text.lstrip()):
            pending, start = text.strip(), number
        if pending.endswith("\\"):
            pending = pending[:-1].rstrip()
            continue
        if pending:
            found.append((start, pending))
            pending = ""
    return found


def documented_commands(path: Path) -> list[tuple[int, str]]:
    """(line, command) of each script command in `path`: fenced code and inline code spans of a
    markdown file (continued lines joined), the module docstring of a Python file, or
    `# python scripts/...` comment lines of a YAML config."""
    if path.suffix == ".py":
        return docstring_commands(path)
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    found, fence, fenced = [], False, []
    if path.suffix == ".md":
        found += inline_commands(without_fences(text))
    for number, line in enumerate(lines, 1):
        if path.suffix == ".yaml":
            text = re.sub(r"\s+\([^()]*\)$", "", line.lstrip("# ").split("  #")[0].strip())  # a trailing remark: "(DPR's ...)"
            if line.startswith("#") and (text.startswith(("python scripts/", "python -m taser.", "torchrun ")) or COMMAND_START.match(text)):
                found.append((number, text))
            continue
        if line.strip().startswith("```"):
            fence = not fence
            continue
        if fence:
            fenced.append((number, line.split(" #")[0].rstrip() if not line.lstrip().startswith("#") else ""))
    return found + joined_commands(fenced)


def _first_of_sweep(override: str) -> str:
    """`key=a,b,c` -> `key=a` (commas outside brackets and quotes only)."""
    key, sep, value = override.partition("=")
    if not sep or value.startswith(("[", "{", "'", '"')):
        return override
    depth, out = 0, ""
    for ch in value:
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        elif ch == "," and depth == 0:
            break
        out += ch
    return f"{key}={out}"


PLACEHOLDER = re.compile(r"<[^<>]*>")  # `source=<file.cp>`: the reader fills it in
OPTIONAL = re.compile(r"^\[([\w.]+=[^\[\]]*)\]$")  # `[base_model=bert-base-uncased]`: an optional setting


def overrides_of(command: str) -> tuple[str, list[str]]:
    """(script, Hydra overrides) of a documented command; placeholders composed as a plain value."""
    words = [OPTIONAL.sub(r"\1", w) for w in shlex.split(PLACEHOLDER.sub("placeholder", command))]
    found = SCRIPT.search(" ".join(words))
    script = script_name(found)
    at = next(i for i, w in enumerate(words) if w.endswith((f"scripts/{script}.py", f"taser.{script}", "taser-" + script.replace("_", "-"))))
    args = words[at + 1 :]
    sweep = "-m" in args or "--multirun" in args
    overrides = [a for a in args if not a.startswith("-") and "=" in a]
    return script, [_first_of_sweep(o) for o in overrides] if sweep else overrides


def documents() -> list[Path]:
    docs = sorted((ROOT / "docs").rglob("*.md")) if (ROOT / "docs").is_dir() else []
    return [ROOT / "README.md", *docs, *sorted((ROOT / "configs").glob("*.yaml")), *sorted((ROOT / "scripts").glob("*.py")),
            *sorted(command_modules().values())]


def register_all_schemas() -> None:
    """The schemas the scripts register at import (taser.cli registers the others)."""
    from taser.gpu_check.job import register_schema
    from taser.reader.config import register_schemas

    register_schema()
    register_schemas()


def refused_keys(config_name: str, overrides: list[str]) -> list[str]:
    from taser.override_check import _schema_of, unknown_setting

    schema = _schema_of(Path(CONFIG_DIR), config_name)
    groups = {p.name for p in Path(CONFIG_DIR).iterdir() if p.is_dir()}
    keys = [o.split("=", 1)[0] for o in overrides if not o.startswith(("+", "~", "hydra.", "hydra/"))]
    return [why for key in keys if schema is not None and (why := unknown_setting(key, schema, groups))]


def check(path: Path, scripts: dict[str, str]) -> list[str]:
    register_all_schemas()
    failures = []
    for line, command in documented_commands(path):
        try:
            script, overrides = overrides_of(command)
        except ValueError as e:
            failures.append(f"{path.relative_to(ROOT)}:{line}: {command}\n    cannot be read as a shell command: {e}")
            continue
        if script not in scripts:
            continue  # not a Hydra app (benchmarks' own argparse scripts live elsewhere)
        try:
            with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
                compose(scripts[script], overrides=overrides, return_hydra_config=True)
        except Exception as e:  # noqa: BLE001 (any composition error is the finding)
            failures.append(f"{path.relative_to(ROOT)}:{line}: {command}\n    {type(e).__name__}: {str(e).splitlines()[0]}")
            continue
        refused = refused_keys(scripts[script], overrides)  # the commands' own key check must pass what Hydra composes
        if refused:
            failures.append(f"{path.relative_to(ROOT)}:{line}: {command}\n    composes, but the command's key check refuses it: {refused}")
    return failures


@pytest.mark.slow
def test_every_documented_command_composes():
    scripts = hydra_scripts()
    failures, count = [], 0
    for path in documents():
        count += len(documented_commands(path))
        failures += check(path, scripts)
    assert count >= 40, f"only {count} documented commands found: the extraction broke"
    assert not failures, "documented commands that no longer compose:\n" + "\n".join(failures)


def test_a_typo_in_a_documented_command_fails_naming_the_page_and_line(tmp_path, monkeypatch):
    page = tmp_path / "page.md"
    page.write_text("# A page\n\n```bash\npython scripts/train.py model=taser \\\n    train.batch_sizee=4\n```\n")
    scripts = hydra_scripts()
    monkeypatch.setattr("test_documented_commands.ROOT", tmp_path)
    failures = check(page, scripts)
    assert len(failures) == 1 and failures[0].startswith("page.md:4: python scripts/train.py model=taser train.batch_sizee=4")
    assert "batch_sizee" in failures[0]


@pytest.mark.parametrize("command, expected", [
    ("python scripts/train.py -m model=dpr,taser train.seed=1,2,3 'x=[1,2]'", ("train", ["model=dpr", "train.seed=1", "x=[1,2]"])),
    ("torchrun --nproc_per_node=8 scripts/train.py model=dpr data=nq", ("train", ["model=dpr", "data=nq"])),
])
def test_commands_are_read_as_a_shell_reads_them(command, expected):
    assert overrides_of(command) == expected


def test_a_typo_in_an_inline_command_fails_naming_the_page_and_line(tmp_path, monkeypatch):
    page = tmp_path / "page.md"
    page.write_text("# A page\n\nRun it as\n`python scripts/train.py model=taser\ntrain.batch_sizee=4` and see.\n\n"
                    "```bash\npython scripts/train.py model=taser\n```\n")
    scripts = hydra_scripts()
    monkeypatch.setattr("test_documented_commands.ROOT", tmp_path)
    failures = check(page, scripts)
    assert len(failures) == 1 and failures[0].startswith("page.md:4: python scripts/train.py model=taser train.batch_sizee=4")


def test_a_typo_in_a_scripts_docstring_fails_naming_the_file_and_line(tmp_path, monkeypatch):
    script = tmp_path / "tool.py"
    script.write_text('"""A tool.\n\n    python scripts/train.py model=dpr   # fine\n'
                      '`.venv/bin/python scripts/train.py train.stepz=3`\n"""\n\nimport os\n')
    scripts = hydra_scripts()
    monkeypatch.setattr("test_documented_commands.ROOT", tmp_path)
    assert [line for line, _ in documented_commands(script)] == [4, 3]
    failures = check(script, scripts)
    assert len(failures) == 1 and failures[0].startswith("tool.py:4: .venv/bin/python scripts/train.py train.stepz=3")


@pytest.mark.parametrize("spelling", ["python scripts/train.py", "taser-train", "python -m taser.train", "torchrun --nproc_per_node=2 -m taser.train"])
def test_each_spelling_of_a_command_is_composed(tmp_path, monkeypatch, spelling):
    page = tmp_path / "page.md"
    page.write_text(f"# A page\n\n```bash\n{spelling} model=taser train.batch_sizee=4\n```\n\nInline: `{spelling} model=taser`.\n")
    scripts = hydra_scripts()
    monkeypatch.setattr("test_documented_commands.ROOT", tmp_path)
    assert sorted(command for _, command in documented_commands(page)) == sorted([f"{spelling} model=taser train.batch_sizee=4", f"{spelling} model=taser"])
    failures = check(page, scripts)
    assert len(failures) == 1 and "batch_sizee" in failures[0], failures


def test_the_installed_spellings_of_every_command_are_counted(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("```bash\ntaser-build-index embeddings=x\npython -m taser.gpu_check scale=dry_run\npip install taser-retrieval\n"
                    "python -m taser.pipeline.stage_code keep squad\n```\n")
    assert [overrides_of(c)[0] for _, c in documented_commands(page)] == ["build_index", "gpu_check"]
