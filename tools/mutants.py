"""Mutation testing of one library module: `make mutants MODULE=taser/pipeline/stages.py`
(optionally `TESTS="tests/test_stage_keys.py tests/test_stage_locks.py"`).

mutmut (pinned in the `dev` extra) writes small bugs into the module one at a time and runs the
tests that reach the mutated function; a mutant no test notices *survives*. Here:

1. the working tree's tracked files (uncommitted edits included) are copied into
   `.mutants/<module>/`, so the checkout itself is never mutated and a run can go on while you work;
2. mutmut is configured there to mutate that module only and to run the test files that import it
   (or `TESTS`);
3. the score is printed: (killed + timed out + justified equivalent) / (mutants − skipped), with
   each survivor's name and `mutmut show`-style diff command; justified equivalents are the lines
   of `benchmarks/mutants/equivalent.txt` (`<mutant name>  # why no test can tell it apart`);
4. the module's line in `benchmarks/mutants/results.md` is replaced with this run's figures, the
   machine and the date.

Slow (minutes to an hour a module on 2 cores), so not in CI: run it on the modules a change
touches and kill or justify what survives (docs/architecture.md, "Mutation testing").
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "mutants" / "results.md"
EQUIVALENT = ROOT / "benchmarks" / "mutants" / "equivalent.txt"
ALSO_COPY = ["configs/", "data/", "scripts/", "hydra_plugins/", "benchmarks/", "docs/", "README.md", "mkdocs.yml"]
HEADER = ["# Mutation scores", "", "Written by `make mutants MODULE=...` (tools/mutants.py), one line per module, the latest run's.",
          "Score = (killed + timed out + justified equivalent) / (mutants − skipped); equivalents: `benchmarks/mutants/equivalent.txt`.", "",
          "| module | mutants | killed | timed out | survived | equivalent | no tests | score | tests | machine | date |",
          "|---|---|---|---|---|---|---|---|---|---|---|"]


def dotted(module: Path) -> str:
    return ".".join(module.with_suffix("").parts)


def tests_reaching(module: Path) -> list[str]:
    """Test files that import the module (by its dotted name, or `from <package> import <name>`)."""
    name = dotted(module)
    package, _, leaf = name.rpartition(".")
    pattern = re.compile(rf"\b{re.escape(name)}\b|from {re.escape(package)} import [^\n]*\b{re.escape(leaf)}\b")
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py") if pattern.search(p.read_text(encoding="utf-8")))


def copy_tree(work: Path) -> None:
    """The tracked files as they are in the working tree now (deleted ones left out)."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            (work / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, work / name)


def setup_cfg(module: Path, tests: list[str]) -> str:
    # forkserver: torch and FAISS's OpenMP pool are not fork-safe once a test has used them
    lines = ["[mutmut]", "source_paths=taser/", f"only_mutate={module.as_posix()}", "process_isolation=forkserver", "forkserver_warmup=collect", "also_copy="]
    lines += [f"    {path}" for path in ALSO_COPY]
    lines += ["pytest_add_cli_args=", "    -q", "    -p", "    no:cacheprovider", "    -m", "    not cluster", "pytest_add_cli_args_test_selection="]
    lines += [f"    {t}" for t in tests]
    return "\n".join(lines) + "\n"


def equivalents() -> dict[str, str]:
    found = {}
    if EQUIVALENT.exists():
        for line in EQUIVALENT.read_text(encoding="utf-8").splitlines():
            name, _, why = line.partition("#")
            if name.strip():
                found[name.strip()] = why.strip()
    return found


def survivors(work: Path, mutmut: str, env: dict) -> list[str]:
    listed = subprocess.run([mutmut, "results"], cwd=work, env=env, capture_output=True, text=True, check=True).stdout
    return [line.split(":")[0].strip() for line in listed.splitlines() if line.strip().endswith(": survived")]


def machine() -> str:
    import platform

    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")),
                 platform.processor()) if Path("/proc/cpuinfo").exists() else platform.processor()
    return f"{model}, {os.cpu_count()} cores"


def record(module: Path, stats: dict, equivalent: int, tests: list[str]) -> str:
    tested = stats["total"] - stats["skipped"]
    score = (stats["killed"] + stats["timeout"] + equivalent) / tested if tested else 0.0
    row = (f"| `{module.as_posix()}` | {stats['total']} | {stats['killed']} | {stats['timeout']} | {stats['survived'] - equivalent} | {equivalent} | "
           f"{stats['no_tests']} | {100 * score:.1f}% | {len(tests)} files | {machine()} | {datetime.date.today().isoformat()} |")
    lines = RESULTS.read_text(encoding="utf-8").splitlines() if RESULTS.exists() else list(HEADER)
    lines = [line for line in lines if not line.startswith(f"| `{module.as_posix()}` |")] + [row]
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return f"{module}: {100 * score:.1f}% ({stats['killed']} killed, {stats['timeout']} timed out, {equivalent} equivalent, of {tested} mutants)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("module", type=Path, help="a library module, e.g. taser/pipeline/stages.py")
    ap.add_argument("--tests", nargs="*", help="test files to run (default: those that import the module)")
    ap.add_argument("--keep", action="store_true", help="reuse .mutants/<module>/ from an earlier run (mutmut resumes)")
    args = ap.parse_args()
    module = args.module.resolve().relative_to(ROOT) if args.module.is_absolute() else args.module
    if not (ROOT / module).is_file() or module.parts[0] != "taser":
        sys.exit(f"{args.module}: not a module of the library (taser/...)")
    tests = args.tests or tests_reaching(module)
    if not tests:
        sys.exit(f"no test file imports {dotted(module)}: name them with TESTS=...")
    work = ROOT / ".mutants" / dotted(module)
    if work.exists() and not args.keep:
        shutil.rmtree(work)
    if not work.exists():
        work.mkdir(parents=True)
        copy_tree(work)
    (work / "setup.cfg").write_text(setup_cfg(module, tests), encoding="utf-8")
    mutmut = str(Path(sys.executable).with_name("mutmut"))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    print(f"mutating {module}; tests: {' '.join(tests)}; in {work}", flush=True)
    subprocess.run([mutmut, "run"], cwd=work, env=env, check=True)
    subprocess.run([mutmut, "export-cicd-stats"], cwd=work, env=env, check=True, capture_output=True)
    stats = json.loads((work / "mutants" / "mutmut-cicd-stats.json").read_text())
    justified = equivalents()
    alive = survivors(work, mutmut, env)
    equivalent = [name for name in alive if name in justified]
    for name in alive:
        print(f"  survived: {name}" + (f"  (equivalent: {justified[name]})" if name in justified else f"   see: (cd {work} && {mutmut} show {name})"))
    print(record(module, stats, len(equivalent), tests))


if __name__ == "__main__":
    main()
