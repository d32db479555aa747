"""Peak memory of an index build against the final index, per type, with and without reserving the
final capacity first (`taser.retrieval.index_memory.reserve`), side by side in one run.

    python benchmarks/index/peak_memory.py                       # 1M vectors of width 128, every type (~20 min on 2 cores)
    python benchmarks/index/peak_memory.py --count 200000 --types flat hnsw --also   # a quick look

Each build runs in a fresh process: random unit vectors generated chunk by chunk (never all in
memory), built by the library's `PassageIndex.build_streamed`. Measured there: the resident memory
just before the build, the peak (VmHWM) of the whole build, and the peak of the adding phase alone
(VmHWM reset with /proc/self/clear_refs once the type is trained, just before the first add); the
final size is the index as FAISS writes it. Ratios are peak increase / final size. "without" runs
the same build with `reserve` made a no-op: the code as it was before this lever. HNSW is built
with efConstruction 40 (memory does not depend on it; time does), 32 neighbours per node.

`--also TYPE:COUNT` builds a type once more at another count, with the reservation only: an
index whose final size is small beside its fixed costs (`ivf_pq`'s training sample, FAISS's work
buffers of one add) shows how its ratio falls as the corpus grows.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from common import ROOT, command_line, machine_line  # noqa: E402

TYPES = ["flat", "hnsw", "hnsw_sq8", "ivf_pq"]
CHUNK = 10_000


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def worker(index_type: str, count: int, width: int, with_reserve: bool) -> dict:
    import faiss
    import numpy as np

    import taser.retrieval.faiss_index as faiss_index
    from taser.retrieval.index_types import IndexConfig

    faiss.omp_set_num_threads(os.cpu_count() or 1)
    real_reserve = faiss_index.reserve
    marks = {}

    def reserve(index, n, sizes=None):  # the adding phase starts here: its own peak from now on
        if "training_peak_kb" not in marks:
            marks["training_peak_kb"] = _status_kb("VmHWM")
            Path("/proc/self/clear_refs").write_text("5")
        if with_reserve:
            real_reserve(index, n, sizes)

    faiss_index.reserve = reserve

    def chunks():
        for start in range(0, count, CHUNK):
            rng = np.random.default_rng(start)
            x = rng.standard_normal((min(CHUNK, count - start), width), dtype=np.float32)
            x /= np.linalg.norm(x, axis=1, keepdims=True)
            yield x, [str(i) for i in range(start, start + len(x))]

    config = IndexConfig(index_type, ef_construction=40)
    before = _status_kb("VmRSS")
    built = faiss_index.PassageIndex.build_streamed(chunks, count, width, config)
    peak = _status_kb("VmHWM")
    with tempfile.TemporaryDirectory() as tmp:
        faiss.write_index(built.index, os.path.join(tmp, "index.faiss"))
        final = os.path.getsize(os.path.join(tmp, "index.faiss"))
    return {"type": index_type, "reserve": with_reserve, "count": count, "width": width, "final_bytes": final + built._ids.nbytes,
            "before_kb": before, "whole_peak_increase_bytes": (max(peak, marks.get("training_peak_kb", 0)) - before) * 1024,
            "adding_peak_increase_bytes": (peak - before) * 1024}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--count", type=int, default=1_000_000)
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--types", nargs="+", default=TYPES)
    ap.add_argument("--also", nargs="*", default=["ivf_pq:8000000"], metavar="TYPE:COUNT")
    ap.add_argument("--out", type=Path, default=HERE / "peak_memory_results.md")
    ap.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        kind, count, width, with_reserve = args.worker
        print(json.dumps(worker(kind, int(count), int(width), with_reserve == "1")))
        return
    builds = [(kind, args.count, with_reserve) for kind in args.types for with_reserve in (False, True)]  # side by side, in one run
    builds += [(kind, int(count), True) for kind, count in (item.split(":") for item in args.also)]
    rows = []
    for kind, count, with_reserve in builds:
        done = subprocess.run([sys.executable, __file__, "--worker", kind, str(count), str(args.width), "1" if with_reserve else "0"],
                              capture_output=True, text=True, cwd=ROOT, check=True)
        row = json.loads(done.stdout.strip().splitlines()[-1])
        rows.append(row)
        print(json.dumps(row), flush=True)
    lines = ["# Index builds: peak memory against the final index\n", f"Command: `{command_line(__file__, sys.argv[1:])}`\n", f"{machine_line()}\n",
             f"Random unit vectors of width {args.width} ({args.count:,} unless the row says), added in chunks of {CHUNK:,} (each chunk: "
             f"{CHUNK * args.width * 4 / 1e6:.1f} MB). Peak increase = VmHWM − resident memory just before the build; the adding "
             "phase's peak counts from the resident memory before the build too, with the high-water mark reset once the type is "
             "trained. Final = the index as FAISS writes it plus the passage ids.\n",
             "| type | vectors | reserve | final MB | whole build: peak increase MB | ratio | adding phase: peak increase MB | ratio |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        final = r["final_bytes"]
        whole, adding = r["whole_peak_increase_bytes"], r["adding_peak_increase_bytes"]
        reserved = "yes" if r["reserve"] else "no (before)"
        lines.append(f"| `{r['type']}` | {r['count']:,} | {reserved} | {final / 1e6:.0f} | {whole / 1e6:.0f} | {whole / final:.2f} | "
                     f"{adding / 1e6:.0f} | {adding / final:.2f} |")
    args.out.write_text("\n".join(lines) + "\n")
    print(args.out.read_text())


if __name__ == "__main__":
    main()
