"""Memory per rank and records/s of the two training-data readers, at 1 and 4 processes.

`python benchmarks/hub_data/run.py --records 1000000 --work /path/with/10GB`

A synthetic bi-encoder JSON shaped like DPR's NQ training file (`synthetic.py`) is written once,
and converted once into its Arrow copy (`data.train_reader=arrow`). Then, for each reader and
each process count, that many processes join a gloo group (CPU) as training ranks do, open the
training set through `taser.pipeline.training_data.open_training_data` (the code `scripts/train.py`
runs), and read their share of one shuffled epoch, record by record. Each rank reports its
memory from /proc/self/smaps_rollup after opening and after reading:

- RSS: resident pages, shared ones counted in full by every process that maps them;
- PSS: each shared page divided among the processes that map it (summed over ranks: the
  memory the run really holds);
- USS: pages of this process alone (private), what one more rank adds;

and the peak RSS (VmHWM). Results: `results.json` and the table of `results.md` (written
beside this script unless --out says otherwise).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
sys.path.insert(0, str(HERE))

READERS = ("json", "arrow")


def memory() -> dict:
    """RSS, PSS, USS and peak RSS of this process, in MiB (Linux /proc)."""
    fields = {}
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines()[1:]:
        key, value = line.split(":", 1)
        fields[key.strip()] = int(value.split()[0])  # kB
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    mib = lambda kb: round(kb / 1024, 1)  # noqa: E731
    return {"rss": mib(fields["Rss"]), "pss": mib(fields["Pss"]), "uss": mib(fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0)),
            "pss_file": mib(fields.get("Pss_File", 0)), "pss_anon": mib(fields.get("Pss_Anon", 0)), "peak_rss": mib(int(status["VmHWM"].split()[0]))}


def rank_main(rank: int, world: int, rendezvous: str, reader: str, source: str, cache_dir: str, out: str, seed: int) -> None:
    import numpy as np
    import torch.distributed as dist

    from taser.data.config import DataConfig
    from taser.pipeline.training_data import open_training_data
    from taser.training.distributed import DistInfo

    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    info = DistInfo(rank, world, rank)
    report = {"rank": rank, "baseline": memory()}
    dist.barrier()
    start, cpu = time.perf_counter(), time.process_time()
    data = open_training_data(DataConfig(train_files=[source], train_reader=reader, arrow_cache_dir=cache_dir), info)
    report["open_s"], report["open_cpu_s"] = round(time.perf_counter() - start, 2), round(time.process_time() - cpu, 2)
    report["opened"] = memory()
    train = data.sets[0]
    order = np.random.default_rng(seed).permutation(len(train))[rank::world]  # this rank's share of one shuffled epoch
    dist.barrier()
    start, cpu = time.perf_counter(), time.process_time()
    chars = 0
    for i in order:
        record = train[int(i)]
        chars += len(record["positive_ctxs"][0]["text"])
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu
    report.update(records=len(order), read_s=round(seconds, 2), records_per_s=round(len(order) / seconds, 1), read_cpu_s=round(cpu_seconds, 2),
                  records_per_cpu_s=round(len(order) / cpu_seconds, 1), read=memory(), checksum=chars)
    gathered = [None] * world
    dist.all_gather_object(gathered, report)
    if rank == 0:
        Path(out).write_text(json.dumps(gathered, indent=2))
    dist.barrier()
    dist.destroy_process_group()


def run_group(reader: str, world: int, source: Path, cache_dir: Path, seed: int) -> list[dict]:
    """`world` ranks as separate processes (as torchrun starts them), each at the lowest priority."""
    with tempfile.TemporaryDirectory() as tmp:
        rendezvous, out = Path(tmp) / "rendezvous", Path(tmp) / "out.json"
        code = (f"import sys; sys.path.insert(0, {str(HERE)!r}); import run; "
                f"run.rank_main(int(sys.argv[1]), {world}, {str(rendezvous)!r}, {reader!r}, {str(source)!r}, {str(cache_dir)!r}, {str(out)!r}, {seed})")
        procs = [subprocess.Popen([sys.executable, "-c", code, str(r)], env={**os.environ, "OMP_NUM_THREADS": "1"}) for r in range(world)]
        codes = [p.wait() for p in procs]
        if any(codes):
            raise RuntimeError(f"{reader} x {world}: exit codes {codes}")
        return json.loads(out.read_text())


def cpu_kind() -> str:
    import torch

    model = next((line.split(":", 1)[1].strip() for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()
                  if line.startswith("Model name")), platform.processor())
    return f"{model}, torch capability {torch.backends.cpu.get_cpu_capability()}, {os.cpu_count()} cores"


def table(results: dict) -> str:
    """Per rank, the mean over ranks after reading its share of the epoch (open: the slowest rank)."""
    lines = ["| reader | processes | open: wall s / CPU s | records/s: wall / per CPU-second | RSS | PSS = anon + file | USS | peak RSS | "
             "PSS of all ranks = anon + file |", "|---|---|---|---|---|---|---|---|---|"]
    for key, ranks in results["groups"].items():
        reader, world = key.split("x")

        def mean(f, ranks=ranks):
            return sum(f(r) for r in ranks) / len(ranks)

        def total(f, ranks=ranks):
            return sum(f(r) for r in ranks)

        lines.append(
            f"| {reader} | {world} | {max(r['open_s'] for r in ranks):.0f} / {mean(lambda r: r['open_cpu_s']):.1f} | "
            f"{mean(lambda r: r['records_per_s']):,.0f} / {mean(lambda r: r['records_per_cpu_s']):,.0f} | {mean(lambda r: r['read']['rss']):,.0f} | "
            f"{mean(lambda r: r['read']['pss']):,.0f} = {mean(lambda r: r['read']['pss_anon']):,.0f} + {mean(lambda r: r['read']['pss_file']):,.0f} | "
            f"{mean(lambda r: r['read']['uss']):,.0f} | {mean(lambda r: r['read']['peak_rss']):,.0f} | "
            f"{total(lambda r: r['read']['pss']):,.0f} = {total(lambda r: r['read']['pss_anon']):,.0f} + {total(lambda r: r['read']['pss_file']):,.0f} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--records", type=int, default=1_000_000)
    p.add_argument("--work", default="outputs/benchmarks/hub_data", help="where the synthetic JSON and its Arrow copy go")
    p.add_argument("--procs", type=int, nargs="+", default=[1, 4])
    p.add_argument("--readers", nargs="+", default=list(READERS), choices=READERS)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--markdown", help="also write the table (and the run's facts) to this file")
    p.add_argument("--out", default=str(HERE / "results.json"))
    p.add_argument("--table", metavar="RESULTS_JSON", help="print the table of a results.json written before, and stop")
    a = p.parse_args()
    if a.table:
        print(table(json.loads(Path(a.table).read_text())))
        return

    from synthetic import records as synthetic_records

    from taser.data.arrow_training import arrow_cache_path, ensure_arrow_copy
    from taser.data.biencoder_json import write_biencoder_json

    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    source, cache_dir = work / f"nq-shape-{a.records}.json", work / "arrow"
    prep = {}
    if not source.is_file():
        start = time.perf_counter()
        write_biencoder_json(source, synthetic_records(a.records))
        prep["generate_s"] = round(time.perf_counter() - start, 1)
    cache_dir.mkdir(exist_ok=True)
    copy = arrow_cache_path(source, cache_dir)
    if not copy.is_file():
        start = time.perf_counter()
        ensure_arrow_copy(source, cache_dir)
        prep["convert_s"] = round(time.perf_counter() - start, 1)
    prep.update(json_bytes=source.stat().st_size, arrow_bytes=copy.stat().st_size)
    groups = {}
    for reader in a.readers:
        for world in a.procs:
            subprocess.run(["sync"], check=False)
            groups[f"{reader}x{world}"] = run_group(reader, world, source, cache_dir, a.seed)
            print(f"{reader} x {world}: {json.dumps(groups[f'{reader}x{world}'][0])}", flush=True)
    results = {"records": a.records, "cpu": cpu_kind(), "prep": prep, "groups": groups,
               "command": "python benchmarks/hub_data/run.py " + " ".join(sys.argv[1:]), "date": time.strftime("%Y-%m-%d")}
    Path(a.out).write_text(json.dumps(results, indent=2))
    print(table(results))
    if a.markdown:
        Path(a.markdown).write_text(f"{results['command']} ({results['date']}; {results['cpu']}; prep {json.dumps(prep)})\n\n{table(results)}\n")


if __name__ == "__main__":
    main()
