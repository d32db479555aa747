"""Index types at a million vectors: build time and peak memory, size, search speed and recall
against exact search, extrapolated to DPR's 21,015,324 passages; and the encode path at 100,000
passages of real text (rate, memory, resume after a kill).

    python benchmarks/index/run.py                      # everything (about an hour on 2 cores)
    python benchmarks/index/run.py --widths 384 --count 200000 --skip-encode   # a quick look

The vectors are sampled from a mixture fitted to real embeddings (see synthetic.py), written as
an embeddings directory of 10 shards exactly as `scripts/encode_passages.py` writes them, and
indexed by the library's own `build_index` in a fresh process per type, so each build's peak
memory is its own. Search runs in another fresh process.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from common import ROOT, command_line, machine_line, prepare_squad, write_keeping_section  # noqa: E402

DPR_PASSAGES = 21_015_324
NOTES = "## Notes"  # a section written by hand, kept when the script re-writes results.md
SHARDS = 10
CHUNK = 20_000
QUERIES = 1000
LATENCY_QUERIES = 100
# type specs: an index type, optionally with settings (`ivf_pq:pq_m=128,opq=true`)
# (OPQ is left out by default: training its rotation took over 20 minutes at 50,000 x 384 on 2 cores)
DEFAULT_TYPES = ["flat", "hnsw", "hnsw_sq8", "ivf_pq", "ivf_pq:pq_m=128"]
# search-time settings tried on each built index (no rebuild): the default first
SEARCH_SETTINGS = {"hnsw": [{}, {"ef_search": 512}, {"ef_search": 2048}], "hnsw_sq8": [{}, {"ef_search": 512}, {"ef_search": 2048}],
                   "ivf_pq": [{}, {"nprobe": 256}]}


def peak_rss_gb() -> float:
    """This process's own peak (VmHWM; ru_maxrss would carry the parent's peak across fork+exec)."""
    return hwm_gb(os.getpid())


def parse_spec(spec: str) -> dict:
    kind, _, rest = spec.partition(":")
    settings = {"type": kind}
    for pair in filter(None, rest.split(",")):
        key, value = pair.split("=")
        settings[key] = {"true": True, "false": False}.get(value, int(value) if value.isdigit() else value)
    return settings


def slug(spec: str) -> str:
    return spec.replace(":", "-").replace(",", "-").replace("=", "")


def run_child(*args: str) -> dict:
    proc = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{args}: failed\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# -- data -------------------------------------------------------------------------------------


def write_vectors(out: Path, count: int, width: int, passages: Path, questions: list[str], work: Path) -> None:
    """`count` sampled passage vectors as an embeddings directory, and the sampled queries."""
    import numpy as np
    from synthetic import fitted

    from taser.data.passages import read_passages
    from taser.retrieval.embeddings import ShardWriter, read_manifests, shard_range

    try:
        if read_manifests(out / "embeddings")[-1]["end"] == count and (out / "queries.npy").is_file():
            return
    except (FileNotFoundError, ValueError):
        pass
    texts = [p.text for p in read_passages(passages)]
    passage_mix = fitted(texts, width, work / f"real-passages-{width}.npy")
    question_mix = fitted(questions, width, work / f"real-questions-{width}.npy")
    np.save(out / "queries.npy", question_mix.sample(QUERIES + LATENCY_QUERIES, np.random.default_rng(1)))
    identity = {"name": f"synthetic-{count}x{width}", "size": 0, "rows": count, "head_tail_sha1": "-"}
    checkpoint = {"name": "mixture fitted to the shipped MiniLM's embeddings of the shipped SQuAD passages"}
    for shard in range(SHARDS):
        start, end = shard_range(count, shard, SHARDS)
        writer = ShardWriter(out / "embeddings", {"checkpoint": checkpoint, "passages": identity, "num_shards": SHARDS, "shard_id": shard,
                                                  "start": start, "end": end, "chunk_size": CHUNK, "dtype": "float16"})
        for i in range(writer.done(), writer.num_chunks):
            lo, hi = writer.chunk_rows(i)
            rng = np.random.default_rng(10_000 * (shard + 1) + i)
            writer.write_chunk(i, passage_mix.sample(hi - lo, rng), [str(r) for r in range(lo, hi)])
        writer.finish(width)


def realism(width: int, work: Path, passages: Path, questions: list[str]) -> dict:
    """Mean score of the 1st/10th/100th passage for 500 questions: real embeddings vs the mixture's
    samples, at the real corpus's size (2,141 passages)."""
    import faiss
    import numpy as np
    from synthetic import fitted

    from taser.data.passages import read_passages

    real_p, real_q = np.load(work / f"real-passages-{width}.npy"), np.load(work / f"real-questions-{width}.npy")
    fit_p = fitted([p.text for p in read_passages(passages)], width, work / f"real-passages-{width}.npy")
    fit_q = fitted(questions, width, work / f"real-questions-{width}.npy")
    rng = np.random.default_rng(7)

    def scores(p, q):
        index = faiss.IndexFlatIP(p.shape[1])
        index.add(p)
        top, _ = index.search(q, 100)
        return [round(float(top[:, k - 1].mean()), 3) for k in (1, 10, 100)]

    return {"real": scores(real_p, real_q[:500]), "sampled": scores(fit_p.sample(len(real_p), rng), fit_q.sample(500, rng))}


# -- workers (each in a fresh process) --------------------------------------------------------


def worker_build(embeddings: str, out: str, spec: str) -> dict:
    from taser.cli import setup_logging
    from taser.pipeline.index import build_index
    from taser.retrieval.index_types import IndexConfig

    setup_logging()
    result = build_index(embeddings, out, IndexConfig(**parse_spec(spec)))
    return {"build_s": result["seconds"], "build_peak_rss_gb": peak_rss_gb(), "resolved": result["type"]}


def worker_search(index_dir: str, queries: str, truth: str | None, settings: str = "{}") -> dict:
    """Batch throughput, one-query latency and recall against `truth`, with the index's search
    settings replaced by `settings` (JSON: ef_search, nprobe)."""
    from dataclasses import replace

    import faiss
    import numpy as np

    from taser.retrieval.faiss_index import load_index

    start = time.perf_counter()
    index = load_index(index_dir)
    load_s = time.perf_counter() - start
    index.config = replace(index.config, **json.loads(settings))
    all_queries = np.load(queries)
    batch, singles = all_queries[:QUERIES], all_queries[QUERIES:]
    times = []
    for _ in range(3):
        start = time.perf_counter()
        _, ids = index.search(batch, 100)
        times.append(time.perf_counter() - start)
    latencies = []
    for q in singles:
        start = time.perf_counter()
        index.search(q[None], 100)
        latencies.append(time.perf_counter() - start)
    found = np.array([[int(x) for x in row] + [-1] * (100 - len(row)) for row in ids])
    result = {"load_s": load_s, "batch_qps": QUERIES / statistics.median(times), "latency_ms": 1000 * statistics.median(latencies),
              "search_peak_rss_gb": peak_rss_gb(), "threads": faiss.omp_get_max_threads()}
    if truth is None:
        return {**result, "found": found.tolist()}
    exact = np.load(truth)
    for k in (20, 100):
        result[f"recall@{k}"] = float(np.mean([len(set(f[:k]) & set(e[:k])) / k for f, e in zip(found, exact)]))
    return result


# -- the index benchmark ---------------------------------------------------------------------


def disk_gb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 1e9


def index_runs(width: int, count: int, types: list[str], work: Path, passages: Path, questions: list[str], report_only: bool = False,
               search_again: bool = False) -> dict:
    import numpy as np

    from taser.retrieval.index_types import IndexConfig, IndexType, estimated_bytes

    out = work / f"{count}x{width}"
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    write_vectors(out, count, width, passages, questions, work)
    rows, truth = [], out / "truth.npy"
    for spec in (["flat"] + [t for t in types if t != "flat"]):
        index_dir = out / f"index-{slug(spec)}"
        record = out / f"{slug(spec)}.json"
        if record.is_file() and not (search_again and index_dir.is_dir() and not report_only):
            rows.extend(json.loads(record.read_text()))  # already measured (a re-run continues)
            continue
        if report_only:
            continue
        if record.is_file():  # search again (a quiet machine), keeping the build's own figures
            built = {k: json.loads(record.read_text())[0][k] for k in ("build_s", "build_peak_rss_gb", "resolved")}
        else:
            built = run_child("--worker", "build", str(out / "embeddings"), str(index_dir), spec)
        config = IndexConfig(**parse_spec(spec))
        kind = IndexType.parse(built["resolved"], "type")
        size = disk_gb(index_dir)
        measured = []
        for settings in SEARCH_SETTINGS.get(str(kind), [{}]):
            searched = run_child("--worker", "search", str(index_dir), str(out / "queries.npy"), str(truth) if spec != "flat" else "-", json.dumps(settings))
            if spec == "flat":
                np.save(truth, np.array(searched.pop("found")))
                searched.update({"recall@20": 1.0, "recall@100": 1.0})
            shown = spec + "".join(f", {k}={v}" for k, v in settings.items())
            measured.append({"spec": shown, "width": width, "count": count, **built, **searched, "disk_gb": size,
                             "bound_gb": size + count / SHARDS * width * 4 / 1e9 + 1.0, "estimate_gb": estimated_bytes(config, kind, width, count) / 1e9,
                             "dpr_21m_768_gb": estimated_bytes(config, kind, 768, DPR_PASSAGES) / 1e9})
            print(json.dumps(measured[-1]), flush=True)
        record.write_text(json.dumps(measured, indent=2))
        rows.extend(measured)
    return {"width": width, "count": count, "rows": rows, "seconds": time.perf_counter() - start,
            "realism": realism(width, work, passages, questions)}


def index_table(run: dict) -> str:
    flat = next(r for r in run["rows"] if r["spec"] == "flat")
    lines = [
        f"### {run['count']:,} vectors of width {run['width']}\n",
        "Real vs sampled, mean inner product of the 1st / 10th / 100th passage for 500 questions over 2,141 passages: "
        f"real {run['realism']['real']}, sampled {run['realism']['sampled']}.\n",
        "| index | build s | build peak RSS GB | bound GB (index + shard + 1) | disk GB | qps (1,000-query batch) | vs exact | "
        "latency ms (1 query) | recall@20 | recall@100 | est. GB here | est. GB at 21,015,324 x 768 |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in run["rows"]:
        within = "ok" if r["build_peak_rss_gb"] <= r["bound_gb"] else "**over**"
        lines.append(
            f"| `{r['spec']}` | {r['build_s']:.0f} | {r['build_peak_rss_gb']:.2f} | {r['bound_gb']:.2f} ({within}) | {r['disk_gb']:.2f} | "
            f"{r['batch_qps']:.0f} | {r['batch_qps'] / flat['batch_qps']:.1f}x | {r['latency_ms']:.2f} | {r['recall@20']:.3f} | "
            f"{r['recall@100']:.3f} | {r['estimate_gb']:.2f} | {r['dpr_21m_768_gb']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def targets(runs: list[dict]) -> str:
    wide = [r for run in runs if run["width"] == 768 for r in run["rows"]]
    if not wide:
        return "Targets are stated for width 768; not measured in this run.\n"
    flat_qps = next(r for r in wide if r["spec"] == "flat")["batch_qps"]
    bounded = all(r["build_peak_rss_gb"] <= r["bound_gb"] for run in runs for r in run["rows"])
    fits = [r for r in wide if r["dpr_21m_768_gb"] <= 32 and r["recall@100"] >= 0.95 and r["batch_qps"] >= 10 * flat_qps]
    pq = [r for r in wide if r["resolved"] == "ivf_pq" and r["dpr_21m_768_gb"] <= 4]
    best_pq = max(pq, key=lambda r: r["recall@100"], default=None)
    return "\n".join([
        f"- Build peak RSS <= index + one shard + 1 GB, every type and width: **{'met' if bounded else 'not met'}**.",
        "- A type fitting 21M x 768 in <= 32 GB with recall@100 >= 0.95 and >= 10x exact's throughput: "
        + ("**met** by " + ", ".join(f"`{r['spec']}`" for r in fits) + "." if fits else "**not met**."),
        "- `ivf_pq` <= 4 GB at 21M x 768 with recall@100 >= 0.85: "
        + (f"**{'met' if best_pq['recall@100'] >= 0.85 else 'not met'}**: best `{best_pq['spec']}`, recall@100 {best_pq['recall@100']:.3f}, "
           f"{best_pq['dpr_21m_768_gb']:.1f} GB." if best_pq else "not measured."),
    ]) + "\n"


# -- the encode path ----------------------------------------------------------------------------


def hwm_gb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024**2
    except OSError:
        pass
    return 0.0


def encode_run(command: list[str], chunks_dir: Path, seconds: float, log_file: Path) -> dict:
    """Run an encode for `seconds` (or to the end), then SIGKILL it; what it wrote and when."""
    before = set(chunks_dir.glob("chunk_*.npz")) if chunks_dir.is_dir() else set()
    start = time.perf_counter()
    with open(log_file, "a") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "HF_HUB_OFFLINE": "1"})
        first_new, peak = None, 0.0
        while proc.poll() is None and time.perf_counter() - start < seconds:
            time.sleep(0.5)
            peak = max(peak, hwm_gb(proc.pid))
            if first_new is None and chunks_dir.is_dir() and set(chunks_dir.glob("chunk_*.npz")) - before:
                first_new = time.perf_counter() - start
        killed = proc.poll() is None
        if killed:
            proc.send_signal(signal.SIGKILL)
        proc.wait()
    new = sorted(set(chunks_dir.glob("chunk_*.npz")) - before)
    times = sorted(f.stat().st_mtime for f in new)
    gaps = [b - a for a, b in zip(times, times[1:])]
    return {"seconds": time.perf_counter() - start, "killed": killed, "new_chunks": len(new), "first_new_chunk_s": first_new,
            "median_chunk_s": statistics.median(gaps) if gaps else None, "peak_rss_gb": peak, "chunks_before": len(before)}


def encode_benchmark(work: Path, passages: Path, total: int, chunk: int, first_seconds: float, second_seconds: float) -> dict:
    from taser.data.passages import Passage, read_passages, write_passages
    from taser.pipeline.experiment import save_initial

    work.mkdir(parents=True, exist_ok=True)
    big = work / f"passages-{total}.tsv"
    if not big.is_file():
        real = list(read_passages(passages))
        write_passages(big, (Passage(str(i), real[i % len(real)].text, real[i % len(real)].title) for i in range(total)))
    checkpoint = work / "initial"
    if not (checkpoint / "model.safetensors").is_file():
        save_initial({"model_type": "shared"}, work)
    out = work / "embeddings"
    if out.exists():
        import shutil

        shutil.rmtree(out)
    command = [sys.executable, str(ROOT / "scripts" / "encode_passages.py"), f"checkpoint={checkpoint}", f"passages={big}", f"out_dir={out}",
               "shard_id=0", "num_shards=1", f"chunk_size={chunk}", f"hydra.run.dir={work / 'hydra'}"]
    chunks_dir = out / "shard_000_of_001"
    log = work / "encode.log"
    first = encode_run(command, chunks_dir, first_seconds, log)
    second = encode_run(command, chunks_dir, second_seconds, log)
    rate = chunk / statistics.median([x for x in (first["median_chunk_s"], second["median_chunk_s"]) if x])
    return {"passages": total, "chunk": chunk, "first": first, "resumed": second, "passages_per_s": rate,
            "resume_overhead_s": second["first_new_chunk_s"] - chunk / rate if second["first_new_chunk_s"] else None,
            "full_pass_h": total / rate / 3600}


def encode_section(result: dict) -> str:
    first, second = result["first"], result["resumed"]
    return (
        f"### Encode path: {result['passages']:,} passages of real text\n\n"
        f"The shipped SQuAD passages repeated with distinct ids, the shipped MiniLM (`model_type=shared`), "
        f"`scripts/encode_passages.py` with `chunk_size={result['chunk']}`, killed (SIGKILL) after {first['seconds']:.0f} s, "
        f"then the same command again, killed after {second['seconds']:.0f} s.\n\n"
        "| | value |\n|---|---|\n"
        f"| passages/s (median chunk) | {result['passages_per_s']:.1f} |\n"
        f"| peak RSS of the encoding process | {max(first['peak_rss_gb'], second['peak_rss_gb']):.2f} GB |\n"
        f"| first run: start to first chunk on disk | {first['first_new_chunk_s']:.1f} s ({first['new_chunks']} chunks before the kill) |\n"
        f"| re-run: chunks found and kept | {second['chunks_before']} |\n"
        f"| re-run: start to its first new chunk | {second['first_new_chunk_s']:.1f} s, of which one chunk's encoding is "
        f"{result['chunk'] / result['passages_per_s']:.1f} s: **{result['resume_overhead_s']:.1f} s to resume** |\n"
        f"| the whole {result['passages']:,} at this rate | {result['full_pass_h']:.2f} h (not run to the end here) |\n"
    )


# -- main ---------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", type=Path, default=ROOT / "outputs" / "bench-index")
    ap.add_argument("--count", type=int, default=1_000_000)
    ap.add_argument("--widths", type=int, nargs="+", default=[768, 384])
    ap.add_argument("--types", nargs="+", default=DEFAULT_TYPES)
    ap.add_argument("--skip-encode", action="store_true")
    ap.add_argument("--encode-passages", type=int, default=100_000)
    ap.add_argument("--encode-chunk", type=int, default=500)
    ap.add_argument("--encode-seconds", type=float, nargs=2, default=[150.0, 90.0], help="run, kill, re-run for these seconds")
    ap.add_argument("--out", type=Path, default=HERE / "results.md")
    ap.add_argument("--report-only", action="store_true", help="write results.md from what earlier runs measured; measure nothing")
    ap.add_argument("--search-again", action="store_true",
                    help="measure search again on indexes already built (their build figures are kept), e.g. on a quieter machine")
    ap.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        kind, *rest = args.worker
        result = worker_build(*rest) if kind == "build" else worker_search(rest[0], rest[1], None if rest[2] == "-" else rest[2], rest[3])
        print(json.dumps(result))
        return
    args.work.mkdir(parents=True, exist_ok=True)
    prepare_squad(args.work)
    from taser.data.qa import read_qa

    passages = args.work / "data" / "passages.tsv"
    questions = [q.question for name in ("train", "dev") for q in read_qa(args.work / "data" / f"{name}.qa.tsv")]
    runs = [index_runs(width, args.count, args.types, args.work, passages, questions, args.report_only, args.search_again) for width in args.widths]
    encode_record = args.work / "encode" / "result.json"
    encode = None
    if not args.skip_encode:
        if encode_record.is_file():  # measured by an earlier run (delete it to measure again)
            encode = json.loads(encode_record.read_text())
        elif not args.report_only:
            encode = encode_benchmark(args.work / "encode", passages, args.encode_passages, args.encode_chunk, *args.encode_seconds)
            encode_record.write_text(json.dumps(encode, indent=2))
    (args.work / "results.json").write_text(json.dumps({"runs": runs, "encode": encode}, indent=2))
    text = (
        "# Index types at a million vectors, and the encode path\n\n"
        f"Command: `{command_line(__file__)}`\n\n{machine_line()} FAISS with {runs[0]['rows'][0]['threads']} OpenMP threads.\n\n"
        "Vectors are **not** i.i.d. Gaussian: they are sampled from a Gaussian mixture fitted to real embeddings of the shipped "
        "SQuAD passages (queries: of its questions) by the shipped MiniLM (32 k-means clusters, shared full residual covariance, "
        "unit length). Width 384 is MiniLM's own vector; width 768 is two real views of the same text (the final and the third "
        "layer's mean pooling) concatenated, since no BERT-base model is here. See `synthetic.py`; each table's first line "
        "compares real and sampled neighbour scores. Exact search is the `flat` index; recall@k is the share of exact search's "
        "top k found in the index's top k, for 1,000 sampled questions. Settings are the library's defaults (`hnsw`: 32 neighbours, "
        "efConstruction 200, efSearch 128; `ivf_pq`: 4 x sqrt(n) lists, nprobe 64, 64 bytes per vector; 200,000 training vectors) "
        "unless the row names others. Build peak RSS is the whole `build_index` process (Python, numpy, FAISS); the bound is the "
        f"index's size on disk + one of the {SHARDS} shards as float32 + 1 GB. The 21M column is `taser.retrieval.index_types`' "
        "estimate for 21,015,324 vectors of width 768 (the `disk GB` column shows how close the estimate is at 1M).\n\n"
        + "\n".join(index_table(run) for run in runs)
        + "\n## Targets\n\n" + targets(runs)
        + ("\n" + encode_section(encode) if encode else "")
    )
    write_keeping_section(args.out, text, NOTES)
    print(text)


if __name__ == "__main__":
    main()
