"""Imported first by every script, before anything outside the standard library: a Python without
taser's environment (the system's, say, before `source .venv/bin/activate`) is told how to get it
instead of failing on `import hydra` with a `ModuleNotFoundError`."""

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def missing() -> list[str]:
    return [name for name in ("hydra", "taser") if importlib.util.find_spec(name) is None]


def advice(absent: list[str]) -> str:
    script = " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]])
    head = f"{Path(sys.argv[0]).name}: this Python ({sys.executable}) does not have {' and '.join(absent)}: it is not taser's environment.\n"
    if (ROOT / ".venv" / "bin" / "python").exists():
        return (head + "Use the environment `make` built, then run the command again:\n"
                f"    source {ROOT / '.venv' / 'bin' / 'activate'}\n    python {script}\n"
                f"or without activating it:\n    {ROOT / '.venv' / 'bin' / 'python'} {script}")
    return (head + f"Set it up first (in {ROOT}): `make test` or `make demo` creates .venv with everything, "
            "then `source .venv/bin/activate` and run the command again.")


if missing():
    raise SystemExit(advice(missing()))
