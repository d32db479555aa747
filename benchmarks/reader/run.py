"""End-to-end QA on the shipped SQuAD protocol (issue 21): DPR's reader on MiniLM, trained on the
training articles' BM25 retrieval, reading the evaluation articles' passages from several retrievers.

    python benchmarks/reader/run.py --steps 300 --batch 2 --passages 8 --eval-questions 200

Rows: BM25 (the reader's training retriever), zero-shot MiniLM dense retrieval (mean pooling,
normalised: the model's own), DPR's hybrid of the two, trained `dpr` and `taser` retrievers when
`--retriever-steps` > 0 (the demo's settings), and an oracle row (the gold passage alone: reading
comprehension). EM/F1 at k = 1, 5, 20 passages read, beside each retriever's top-k on the same
questions. The evaluation questions are an evenly spaced sample of the 1,971 (all 10 articles).
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import ROOT, SQUAD, command_line, machine_line, prepare_squad, write_keeping_section  # noqa: E402

MINILM = {"model_type": "dpr", "pretrained": "shipped:all-MiniLM-L6-v2", "pooling": "auto", "normalize": "auto"}
NOTES = "## What the figures mean"
log = logging.getLogger("benchmark.reader")
TASER = {"specialize_every": 2, "specialize": "ffn", "routing": "deterministic", "num_experts": 2}


def sample(records: list, n: int | None) -> list:
    if not n or n >= len(records):
        return records
    return [records[i * len(records) // n] for i in range(n)]


def write_json(path: Path, records: list) -> Path:
    from taser.data.retrieval_json import write_retrieval_results

    write_retrieval_results(path, records)
    return path


def oracle_records(work: Path, train_articles: int = 30) -> tuple[list, int]:
    """The evaluation questions with their gold passage as the only ctx (those whose answer lies in one passage)."""
    from taser.data.squad import load_squad

    corpus, articles = load_squad(SQUAD)
    questions = [q for a in articles[train_articles:] for q in a.questions]
    records = []
    for q in questions:
        p = corpus[q.positive] if q.positive is not None else None
        ctxs = [{"id": p.id, "title": p.title, "text": p.text, "score": 1.0, "has_answer": True}] if p else []
        records.append({"question": q.question, "answers": q.answers, "ctxs": ctxs})
    return records, sum(1 for r in records if not r["ctxs"])


def retrievals(args, data: Path, work: Path, times: dict) -> dict[str, Path]:
    """Each retriever's retrieval JSON of the evaluation questions (and BM25's of the training questions)."""
    from taser.pipeline.evaluate import evaluate_bm25, evaluate_hybrid
    from taser.pipeline.experiment import evaluate_checkpoint, save_initial, train_and_evaluate

    bm25 = {"backend": args.bm25_backend, "index_dir": str(work / "bm25-index")}
    found = {}
    t = time.perf_counter()
    for split in ("train", "dev"):
        if not (args.reuse and (work / f"bm25-{split}" / "retrieval.json").is_file()):
            evaluate_bm25(data / f"{split}.qa.tsv", data / "passages.tsv", work / f"bm25-{split}", k=100, bm25=bm25)
    times["BM25: retrieve train + dev (k=100)"] = time.perf_counter() - t
    found["BM25"] = work / "bm25-dev" / "retrieval.json"
    if args.no_dense:
        return found
    files = {"passages": str(data / "passages.tsv"), "qa_file": str(data / "dev.qa.tsv"), "match": "string"}
    t = time.perf_counter()
    found["dense (zero-shot MiniLM)"] = work / "zero-shot" / "eval" / "retrieval.json"
    if not (args.reuse and found["dense (zero-shot MiniLM)"].is_file() and (work / "hybrid" / "retrieval.json").is_file()):
        initial = save_initial(MINILM, work / "zero-shot")
        evaluate_checkpoint("zero-shot", initial, files, work / "zero-shot")
        evaluate_hybrid(initial, work / "zero-shot" / "index", files["qa_file"], files["passages"], work / "hybrid", k=100, bm25=bm25)
    found["hybrid (BM25 + zero-shot MiniLM, λ=1.1)"] = work / "hybrid" / "retrieval.json"
    times["zero-shot dense + hybrid: encode, index, retrieve"] = time.perf_counter() - t
    if args.retriever_steps:
        from common import BASE_TRAIN, prepare_squad_with_bm25

        mined = prepare_squad_with_bm25(work, backend=args.bm25_backend)
        train = {**BASE_TRAIN, "batch_size": 16, "max_steps": args.retriever_steps, "warmup_steps": 10}
        for name, extra in (("dpr", {}), ("taser", {"model_type": "taser", "taser": TASER})):
            t = time.perf_counter()
            train_and_evaluate(name, {**MINILM, **extra}, train, {**mined, "qa_file": files["qa_file"]}, work / f"retriever-{name}")
            found[f"{name} (trained {args.retriever_steps} steps)"] = work / f"retriever-{name}" / "eval" / "retrieval.json"
            times[f"{name} retriever: train, encode, index, retrieve"] = time.perf_counter() - t
        t = time.perf_counter()
        trained = work / "retriever-dpr"
        evaluate_hybrid(trained / "final", trained / "index", files["qa_file"], files["passages"], work / "hybrid-dpr", k=100, bm25=bm25)
        found["hybrid (BM25 + trained dpr, λ=1.1)"] = work / "hybrid-dpr" / "retrieval.json"
        times["hybrid with the trained dpr: retrieve"] = time.perf_counter() - t
    return found


READER_KEYS = ("batch_size", "passages", "max_steps", "learning_rate", "warmup_steps", "seed", "top_n", "max_answers")


def _same_reader(reader_dir: Path, train) -> bool:
    """Whether `reader_dir` holds a finished reader trained with `train`'s settings."""
    summary = reader_dir / "train_summary.json"
    if not (summary.is_file() and (reader_dir / "final" / "model.safetensors").is_file()):
        return False
    done = json.loads(summary.read_text()).get("config", {})
    return all(done.get(key) == getattr(train, key) for key in READER_KEYS)


def main() -> None:
    from taser.data.retrieval_json import read_retrieval_results
    from taser.pipeline.reader import read, train_reader
    from taser.reader.config import ReaderModelSettings, ReaderTrainConfig, ReadJob, TrainReaderJob

    ap = argparse.ArgumentParser()
    ap.add_argument("--work", type=Path, default=ROOT / "outputs" / "bench-reader")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=2, help="questions per step")
    ap.add_argument("--passages", type=int, default=8, help="m: passages per question (1 positive + m-1 negatives)")
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--max-length", type=int, default=256)
    ap.add_argument("--eval-questions", type=int, default=200, help="an evenly spaced sample of the 1,971 evaluation questions (0: all)")
    ap.add_argument("--ks", type=int, nargs="+", default=[1, 5, 20])
    ap.add_argument("--bm25-backend", default="pyserini")
    ap.add_argument("--no-dense", action="store_true", help="BM25 and the oracle only")
    ap.add_argument("--retriever-steps", type=int, default=0, help="> 0: also train dpr and taser retrievers this many steps (the demo: 50)")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results.md")
    ap.add_argument("--reuse", action="store_true",
                    help="keep what --work holds from an earlier run with the same settings (BM25 and zero-shot retrieval, the reader)")
    args = ap.parse_args()
    start = time.perf_counter()
    times: dict[str, float] = {}
    work = args.work
    data = prepare_squad(work).parent
    found = retrievals(args, data, work, times)

    t = time.perf_counter()
    reader_dir = work / "reader"
    train = ReaderTrainConfig(batch_size=args.batch, passages=args.passages, max_steps=args.steps, learning_rate=args.lr,
                              warmup_steps=max(1, args.steps // 10), save_every=0, log_every=25, progress=False)
    job = TrainReaderJob(ReaderModelSettings(pretrained="shipped:all-MiniLM-L6-v2", max_length=args.max_length), train,
                         str(work / "bm25-train" / "retrieval.json"), output_dir=str(reader_dir))
    reused = args.reuse and _same_reader(reader_dir, train)
    if reused:
        log.info("reusing the reader trained in %s with these settings", reader_dir)
    else:
        train_reader(job)
    summary = json.loads((reader_dir / "train_summary.json").read_text())
    times["reader: train" + (" (reused)" if reused else "")] = summary["seconds"]

    rows = []
    for name, path in found.items():
        slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")  # one directory per row: "hybrid-bm25-trained-dpr-1-1"
        subset = write_json(work / "eval-sets" / f"{slug}.json", sample(read_retrieval_results(path), args.eval_questions))
        t = time.perf_counter()
        results = read(ReadJob(str(reader_dir / "final"), str(subset), str(work / "read" / slug), ks=args.ks, progress=False))
        times[f"read: {name}"] = time.perf_counter() - t
        rows.append((name, results))
    oracle, unmatched = oracle_records(work)
    subset = [r for r in sample(oracle, args.eval_questions) if r["ctxs"]]
    t = time.perf_counter()
    results = read(ReadJob(str(reader_dir / "final"), str(write_json(work / "eval-sets" / "oracle.json", subset)), str(work / "read" / "oracle"),
                           ks=[1], progress=False))
    times["read: oracle"] = time.perf_counter() - t
    rows.append(("oracle (gold passage given)", results))

    ks = args.ks
    head = ("| passages from | questions | " + " | ".join(f"top-{k}" for k in ks) + " | " + " | ".join(f"EM@{k}" for k in ks)
            + " | F1 (largest k) |\n|" + "---|" * (3 + 2 * len(ks)) + "\n")
    lines = []
    for name, r in rows:
        cells = [r["top_k"].get(str(k)) for k in ks] + [r["em"].get(str(k)) for k in ks] + [r["f1"][str(max(r["ks"]))]]
        lines.append(f"| {name} | {r['questions']} | " + " | ".join("–" if v is None else f"{v:.1f}" for v in cells) + " |")
    total = time.perf_counter() - start
    text = (
        "# End-to-end QA: DPR's reader on the SQuAD benchmark (shipped data, all-MiniLM-L6-v2, 2 CPU cores)\n\n"
        f"Command: `{command_line(__file__)}`\n\n{machine_line()}\n\n"
        f"Reader: all-MiniLM-L6-v2 encoder + DPR's heads, `[CLS] question [SEP] title [SEP] passage` up to {args.max_length} tokens; "
        f"trained {summary['steps']} steps of {args.batch} questions x {args.passages} passages (1 positive + {args.passages - 1} negatives "
        f"from BM25's top 100 of each training question), lr {args.lr}, {summary['seconds']:.0f} s ({summary['median_step_s']:.2f} s/step); "
        f"{summary['questions']} training questions, skipped {summary['skipped']}. Spans up to 10 tokens.\n\n"
        f"Evaluation: {rows[0][1]['questions']} evaluation questions (an evenly spaced sample of the last 10 articles' 1,971), "
        f"over the 2,141 passages; the oracle row reads the gold passage of those whose answer lies in one passage "
        f"({unmatched} of all 1,971 have none). top-k: the retriever's accuracy on the same questions. Whole run: {total / 60:.1f} min.\n\n"
        + head + "\n".join(lines) + "\n\n## Stage times (s)\n\n| stage | seconds |\n|---|---|\n"
        + "".join(f"| {k} | {v:.0f} |\n" for k, v in times.items())
    )
    write_keeping_section(args.out, text, NOTES)  # the notes written by hand survive a re-run
    print(text)


if __name__ == "__main__":
    main()
