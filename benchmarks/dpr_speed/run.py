"""DPR's speed section (§5.4) on this machine: search-only questions per second of exact (flat)
search and of DPR's HNSW (512 neighbours, efConstruction 200, efSearch 128) against Lucene BM25
per CPU thread, with the offline costs beside them (encoding passages, building each index).

    python benchmarks/dpr_speed/run.py                          # the recorded run
    python benchmarks/dpr_speed/run.py --counts 200000 --hnsw-counts 10000 --lucene-counts 100000   # a quick look
    python benchmarks/dpr_speed/run.py --report-only            # results.md from the records

What stands in for what DPR measured on 21M Wikipedia passages:
- Dense vectors are width 768, sampled from a mixture fitted to the shipped MiniLM's embeddings of
  the shipped SQuAD passages and questions (`benchmarks/index/synthetic.py`; no BERT-base here),
  and indexed by the library's own `build_index` in a fresh process per index.
- Lucene's corpus is made of real sentences: each synthetic passage strings together randomly drawn
  sentences of the shipped SQuAD passages up to 100 words (DPR's passage length). Its vocabulary is
  the 40 articles', far smaller than Wikipedia's, so common terms' posting lists are longer than at
  the same size of real text: per-query BM25 cost here is an upper estimate of real text's at the
  same count. The questions are the real SQuAD questions; every figure searches for 100 passages.
- Questions are encoded before dense search is timed, as in DPR's figure (search only); question
  encoding is reported on its own line.

Every measurement runs in a fresh child process with the thread count it names
(OMP_NUM_THREADS for FAISS; Lucene searches one question at a time on one thread).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from common import MINILM_CLS, ROOT, command_line, encode_rates, machine_line, peak_rss_gb, prepare_squad, write_keeping_section  # noqa: E402

NOTES = "## Notes"
WIDTH = 768
DPR_HNSW = "hnsw:hnsw_m=512,ef_construction=200,ef_search=128"  # configs/index_preset/dpr_hnsw.yaml
QUERIES = 1000  # the questions timed at full threads; one thread times the first SINGLE_QUERIES
SINGLE_QUERIES = 200
PASSAGE_WORDS = 100
PAPER_ENTRY = "dpr.section5_4.speed"  # the paper's figures, from taser/evaluation/reference_figures.yaml
PASSAGES_21M = 21_015_324
PAPER_MACHINE = "Intel Xeon E5-2698 v4, 512 GB"


def paper_figures() -> dict:
    from taser.evaluation.reference_figures import reference_figures

    return reference_figures(PAPER_ENTRY)


def _index_benchmark():
    """benchmarks/index/run.py as a module (its name `run` would clash with this file's)."""
    spec = importlib.util.spec_from_file_location("index_benchmark", HERE.parent / "index" / "run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_child(threads: int, *args: str) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    proc = subprocess.run([sys.executable, __file__, "--worker", *args], capture_output=True, text=True, env=env)
    if proc.returncode:
        raise SystemExit(f"{args}: failed\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# -- workers (each in a fresh process) --------------------------------------------------------


def worker_dense_search(index_dir: str, queries: str, count: str, truth: str) -> dict:
    """Median questions/s over 3 passes of `count` pre-encoded questions, 100 passages each, and
    recall@100 against exact search's ids in `truth` ('-': this is exact search; write them)."""
    import faiss
    import numpy as np

    from taser.retrieval.faiss_index import load_index

    index = load_index(index_dir)
    batch = np.load(queries)[:int(count)]
    times = []
    for _ in range(3):
        start = time.perf_counter()
        _, ids = index.search(batch, 100)
        times.append(time.perf_counter() - start)
    found = [[int(x) for x in row] for row in ids]
    result = {"qps": len(batch) / statistics.median(times), "threads": faiss.omp_get_max_threads(), "queries": len(batch)}
    if truth == "-":
        return {**result, "found": found}
    exact = json.loads(Path(truth).read_text())
    result["recall@100"] = float(np.mean([len(set(f) & set(e)) / 100 for f, e in zip(found, exact)]))
    return result


def worker_lucene_search(index_dir: str, questions: str, count: str) -> dict:
    """Questions/s of Lucene BM25 on one thread: one question at a time, 100 passages each, median of 3 passes."""
    from taser.retrieval.bm25 import BM25Index

    index = BM25Index.load(index_dir)
    asked = json.loads(Path(questions).read_text())[:int(count)]
    for q in asked[:20]:  # the JVM's first searches compile the hot paths
        index.search(q, 100)
    times = []
    for _ in range(3):
        start = time.perf_counter()
        for q in asked:
            index.search(q, 100)
        times.append(time.perf_counter() - start)
    index.close()
    return {"qps": len(asked) / statistics.median(times), "threads": 1, "queries": len(asked)}


def worker_encode(passages: str, questions: str) -> dict:
    """Passages/s and questions/s of the shipped MiniLM ([CLS], DPR's tokenisation) at precision auto."""
    import torch

    from taser.data.passages import read_passages
    from taser.models.loading import load_model
    from taser.runtime import resolve_precision

    precision = resolve_precision("auto")
    model, tokenizer = load_model(MINILM_CLS)
    texts = list(read_passages(passages))
    p_rate, q_rate = encode_rates(model, tokenizer, texts, json.loads(Path(questions).read_text()), precision)
    return {"passages_per_s": p_rate, "questions_per_s": q_rate, "passages": len(texts), "precision": precision,
            "threads": torch.get_num_threads(), "peak_rss_gb": peak_rss_gb()}


# -- data -------------------------------------------------------------------------------------


def sentences_of(passages: Path) -> list[str]:
    from taser.data.passages import read_passages

    found = []
    for p in read_passages(passages):
        found += [s.strip() for s in re.split(r"(?<=[.!?])\s+", p.text) if len(s.split()) >= 3]
    return found


def write_lucene_corpus(out: Path, count: int, passages: Path) -> None:
    """`count` passages of real sentences drawn at random (seeded), each up to PASSAGE_WORDS words."""
    from taser.data.passages import Passage, write_passages

    if out.is_file():
        return
    pool, rng = sentences_of(passages), random.Random(0)

    def synthetic():
        for i in range(count):
            words: list[str] = []
            while len(words) < PASSAGE_WORDS:
                words += rng.choice(pool).split()
            yield Passage(str(i + 1), " ".join(words[:PASSAGE_WORDS]), f"Synthetic {i + 1}")

    write_passages(out, synthetic())


# -- measurements -----------------------------------------------------------------------------


def dense_runs(count: int, specs: list[str], work: Path, passages: Path, questions: list[str], cores: int) -> list[dict]:
    bench = _index_benchmark()
    out = work / f"{count}x{WIDTH}"
    out.mkdir(parents=True, exist_ok=True)
    record = out / "dpr_speed.json"
    done = {r["spec"]: r for r in json.loads(record.read_text())} if record.is_file() else {}
    start = time.perf_counter()
    bench.write_vectors(out, count, WIDTH, passages, questions, work)
    print(f"{count:,} x {WIDTH} vectors: {time.perf_counter() - start:.0f} s", flush=True)
    truth = out / "exact-ids.json"
    for spec in ["flat"] + [s for s in specs if s != "flat"]:
        if spec in done:
            continue
        index_dir = out / f"index-{bench.slug(spec)}"
        built = bench.run_child("--worker", "build", str(out / "embeddings"), str(index_dir), spec)
        row = {"spec": spec, "count": count, "width": WIDTH, "build_s": built["build_s"], "build_peak_rss_gb": built["build_peak_rss_gb"],
               "disk_gb": bench.disk_gb(index_dir)}
        for threads, asked in ((cores, QUERIES), (1, SINGLE_QUERIES)):
            searched = run_child(threads, "dense", str(index_dir), str(out / "queries.npy"), str(asked), "-" if spec == "flat" else str(truth))
            if spec == "flat" and threads == cores:
                truth.write_text(json.dumps(searched.pop("found")))
            searched.pop("found", None)
            row[f"search_{threads}"] = searched
        row["recall@100"] = row[f"search_{cores}"].get("recall@100", 1.0)
        done[spec] = row
        record.write_text(json.dumps(list(done.values()), indent=2))
        print(json.dumps(row), flush=True)
        if spec != "flat":
            shutil.rmtree(index_dir)  # DPR's graph is large; the record keeps its figures
    return list(done.values())


def lucene_run(count: int, work: Path, passages: Path, questions_file: Path, cores: int) -> dict:
    from taser.retrieval.bm25 import BM25Index

    out = work / f"lucene-{count}"
    record = out / "dpr_speed.json"
    if record.is_file():
        return json.loads(record.read_text())
    out.mkdir(parents=True, exist_ok=True)
    corpus = out / "passages.tsv"
    write_lucene_corpus(corpus, count, passages)
    start = time.perf_counter()
    BM25Index.build(corpus, out / "index", backend="pyserini", threads=cores)
    build_s = time.perf_counter() - start
    searched = run_child(1, "lucene", str(out / "index"), str(questions_file), str(SINGLE_QUERIES))
    row = {"count": count, "build_s": build_s, "build_threads": cores, "search_1": searched,
           "disk_gb": sum(f.stat().st_size for f in (out / "index").rglob("*") if f.is_file()) / 1e9}
    record.write_text(json.dumps(row, indent=2))
    print(json.dumps(row), flush=True)
    return row


# -- the report -------------------------------------------------------------------------------


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:,.1f} h" if seconds >= 3600 else f"{seconds / 60:,.0f} min"


def at_21m(points: list[tuple[int, float]]) -> tuple[float, float] | None:
    """Questions/s at 21M passages on a power law through the two largest (count, questions/s) points, and its exponent;
    None with fewer than two counts."""
    if len(points) < 2:
        return None
    (n1, q1), (n2, q2) = sorted(points)[-2:]
    slope = math.log(q2 / q1) / math.log(n2 / n1)
    return q2 * (PASSAGES_21M / n2) ** slope, slope


def report(dense: list[dict], lucene: list[dict], encode: dict | None, cores: int) -> str:
    n, p = PASSAGES_21M, paper_figures()
    lines = [
        f"| system | passages | search threads | questions/s (100 passages each) | questions/s per thread | recall@100 vs exact | build | "
        f"build rate (passages/s) | paper ({PAPER_MACHINE}) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in dense:
        hnsw = row["spec"] == DPR_HNSW
        name = "DPR's HNSW (M 512, efC 200, efS 128)" if hnsw else f"`{row['spec']}` (exact)" if row["spec"] == "flat" else f"`{row['spec']}`"
        paper = f"{p['dense_hnsw_questions_per_s']:.1f} q/s at 21M; build {p['hnsw_build_hours']} h" if hnsw else "–"
        for key in (f"search_{cores}", "search_1"):
            s = row.get(key)
            if not s:
                continue
            lines.append(f"| {name} | {row['count']:,} | {s['threads']} | {s['qps']:,.1f} | {s['qps'] / s['threads']:,.1f} | "
                         f"{row['recall@100']:.3f} | {row['build_s']:,.0f} s | {row['count'] / row['build_s']:,.0f} | {paper} |")
    for row in lucene:
        s = row["search_1"]
        lines.append(f"| Lucene BM25 (pyserini, k1 0.9, b 0.4) | {row['count']:,} | 1 | {s['qps']:,.1f} | {s['qps']:,.1f} | – | "
                     f"{row['build_s']:,.0f} s on {row['build_threads']} threads | {row['count'] / row['build_s']:,.0f} | "
                     f"{p['bm25_questions_per_s_per_thread']} q/s per thread; index ~{p['lucene_build_minutes']} min |")
    out = "\n".join(lines) + "\n"
    hnsw = [r for r in dense if r["spec"] == DPR_HNSW]
    flat = [r for r in dense if r["spec"] == "flat"]
    out += "\n### At DPR's 21,015,324 passages, from the rates above (linear: a lower bound for HNSW, whose cost per insertion grows with the graph)\n\n"
    if hnsw:
        h = max(hnsw, key=lambda r: r["count"])
        out += (f"- DPR's HNSW build: {_hours(n / (h['count'] / h['build_s']))} on {cores} cores (measured at {h['count']:,}; "
                f"paper: {p['hnsw_build_hours']} h on one server).\n")
    if flat:
        f = max(flat, key=lambda r: r["count"])
        s = f[f"search_{cores}"]
        out += (f"- Exact search: {s['qps'] * f['count'] / n:,.2f} questions/s on {s['threads']} threads "
                f"(its cost is linear in the passages; measured {s['qps']:,.1f} at {f['count']:,}).\n")
    for name, points in (("DPR's HNSW", [(r["count"], r["search_1"]["qps"]) for r in hnsw]),
                         ("Lucene BM25", [(r["count"], r["search_1"]["qps"]) for r in lucene])):
        fitted = at_21m(points)
        if fitted:
            out += (f"- {name} search, one thread: about {fitted[0]:,.1f} questions/s (a power law through the two largest counts: "
                    f"questions/s ∝ passages^{fitted[1]:.2f}; an extrapolation, not a measurement).\n")
    if lucene:
        largest = max(lucene, key=lambda r: r["count"])
        out += (f"- Lucene index: {_hours(n / (largest['count'] / largest['build_s']))} on {largest['build_threads']} threads "
                f"(paper: ~{p['lucene_build_minutes']} min).\n")
    if encode:
        gpu_hours = p["encode_hours_on_8_gpus"] * 8
        out += (f"- Encoding with the shipped MiniLM (6 layers, width 384; BERT-base has twice the layers and width): "
                f"{encode['passages_per_s']:.1f} passages/s, so {_hours(n / encode['passages_per_s'])} on this CPU "
                f"(paper, BERT-base: {p['encode_hours_on_8_gpus']} h on 8 GPUs, {gpu_hours:.0f} GPU-hours). "
                f"Questions: {encode['questions_per_s']:.1f}/s ({encode['precision']}, {encode['threads']} threads, "
                f"{encode['passages']:,} real passages).\n")
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", type=Path, default=ROOT / "outputs" / "bench-dpr-speed")
    ap.add_argument("--counts", type=int, nargs="+", default=[1_000_000, 4_000_000],
                    help="exact search at these counts (the last: the largest this machine's memory holds with room to spare)")
    ap.add_argument("--hnsw-counts", type=int, nargs="+", default=[20_000, 50_000],
                    help="DPR's HNSW at these counts (its build is the slow part: at 1M it would take hours on 2 cores)")
    ap.add_argument("--lucene-counts", type=int, nargs="+", default=[1_000_000, 4_000_000])
    ap.add_argument("--out", type=Path, default=HERE / "results.md")
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        kind, *rest = args.worker
        work = {"dense": worker_dense_search, "lucene": worker_lucene_search, "encode": worker_encode}[kind]
        print(json.dumps(work(*rest)))
        return
    from taser.data.qa import read_qa

    cores = os.cpu_count() or 1
    args.work.mkdir(parents=True, exist_ok=True)
    prepare_squad(args.work)
    passages = args.work / "data" / "passages.tsv"
    questions = [q.question for name in ("train", "dev") for q in read_qa(args.work / "data" / f"{name}.qa.tsv")]
    questions_file = args.work / "questions.json"
    questions_file.write_text(json.dumps(random.Random(0).sample(questions, QUERIES)))
    records = args.work / "results.json"
    recorded = json.loads(records.read_text()) if records.is_file() else {}
    if not args.report_only:
        dense = []
        for count in args.counts:
            dense += dense_runs(count, ["flat"], args.work, passages, questions, cores)
        for count in args.hnsw_counts:
            dense += dense_runs(count, ["flat", DPR_HNSW], args.work, passages, questions, cores)
        lucene = [lucene_run(count, args.work, passages, questions_file, cores) for count in args.lucene_counts]
        encode = recorded.get("encode") or run_child(cores, "encode", str(passages), str(questions_file))
        recorded = {"dense": sorted(dense, key=lambda r: (r["spec"] != "flat", r["count"])), "lucene": lucene, "encode": encode,
                    "cores": cores, "machine": machine_line(), "command": command_line(__file__)}
        records.write_text(json.dumps(recorded, indent=2))
        (HERE / "results.json").write_text(json.dumps(recorded, indent=2))
    else:
        recorded = json.loads((HERE / "results.json").read_text())
    text = (
        "# DPR's speed section (§5.4) on this machine\n\n"
        f"Command: `{recorded['command']}` (`--report-only` rewrites this file from `results.json`)\n\n"
        f"{recorded['machine']} Every search figure is a median of 3 passes in a fresh process with the threads it names.\n\n"
        "Dense vectors: width 768, sampled from a mixture fitted to the shipped MiniLM's embeddings of the shipped SQuAD passages "
        "(`benchmarks/index/synthetic.py`), questions encoded beforehand (search only, as the paper times it). Lucene: passages of "
        "100 words strung together from the shipped passages' real sentences (a small vocabulary: longer posting lists than real "
        "text of the same size), the real SQuAD questions, one at a time on one thread. Every search returns 100 passages. "
        "The paper's figures: `../shared/DESIGN.md` (\"Reference numbers\", DPR §5.4).\n\n"
        + report(recorded["dense"], recorded["lucene"], recorded.get("encode"), recorded["cores"])
    )
    write_keeping_section(args.out, text, NOTES)
    print(text)


if __name__ == "__main__":
    main()
