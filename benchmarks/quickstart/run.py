"""How long `make quickstart` takes: the demo at its quickstart settings (the Makefile's QUICKSTART_SETTINGS), run
`--repeats` times one after another, each in a fresh process as a user starts it; writes results.md beside this
script with each run's wall time, the median, and the machine.

    python benchmarks/quickstart/run.py --repeats 3
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import ROOT, command_line, machine_line  # noqa: E402

OUT = Path(__file__).with_name("results.md")


def quickstart_settings() -> list[str]:
    """The settings `make quickstart` passes to the demo (read from the Makefile, the one place they are written)."""
    line = re.search(r"^QUICKSTART_SETTINGS := (.+)$", (ROOT / "Makefile").read_text(), re.M).group(1)
    return line.split()


def run_once(work: Path) -> tuple[float, str]:
    settings = [s for s in quickstart_settings() if not s.startswith("out_dir=")] + [f"out_dir={work}"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "demo.py"), *settings], cwd=ROOT, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"the quickstart failed:\n{done.stderr[-3000:]}")
    lines = done.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| system"))
    table = "\n".join(line for line in lines[start:] if not line.startswith("!["))  # the table and the stage times, without the plot
    return seconds, table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--work", default=str(ROOT / "outputs" / "benchmarks" / "quickstart"))
    args = parser.parse_args()
    times, table = [], ""
    for i in range(args.repeats):
        seconds, table = run_once(Path(args.work) / f"run-{i}")
        times.append(seconds)
        print(f"run {i + 1}: {seconds:.1f} s", flush=True)
    lines = ["# make quickstart: wall time", "",
             f"Command: `{command_line(__file__)}` ({datetime.date.today().isoformat()}); each run a fresh `python scripts/demo.py "
             f"{' '.join(quickstart_settings())}` (the settings of `make quickstart`), start-up and model loading included, "
             "one after another on an otherwise idle machine.", "",
             machine_line(), "",
             f"Wall time per run (s): {', '.join(f'{t:.1f}' for t in times)}; median **{statistics.median(times):.1f} s**.", "",
             "The last run's table (the quickstart's output; the intervals are 95% bootstrap intervals over the questions):", "", table, ""]
    OUT.write_text("\n".join(lines), encoding="utf-8")
    print(OUT.read_text())


if __name__ == "__main__":
    main()
