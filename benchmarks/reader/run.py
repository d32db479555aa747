"""End-to-end QA on the shipped SQuAD protocol: DPR's reader on MiniLM, trained in two stages
(reading comprehension on the training questions' gold passages, then the open-domain stage on
their BM25 retrieval with the gold passage as the positive), reading the evaluation articles'
passages from several retrievers.

    python benchmarks/reader/run.py --reading-steps 900 --reading-batch 32 --steps 400 --batch 4 --passages 8 --retriever-steps 60

Rows: an oracle (the gold passage alone: reading comprehension), BM25 (the reader's training
retriever), zero-shot MiniLM dense retrieval (mean pooling, normalised: the model's own), DPR's
hybrid of the two, trained `dpr` and `taser` retrievers when `--retriever-steps` > 0 (the demo's
settings) and a hybrid of BM25 with the trained `dpr`. EM/F1 at k = 1, 5, 20 passages read,
beside each retriever's top-k on the same questions, and each row's EM@1 against BM25's, paired by
question. All 1,971 evaluation questions (`--eval-questions N`: an evenly spaced sample).
`--reuse` keeps what an earlier run left in `--work` (retrievals, readers, readings).
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
    """`records` as a retrieval JSON at `path`, left untouched when it holds them already (its time
    tells --reuse whether the reading of it is older)."""
    from taser.data.retrieval_json import write_retrieval_results

    fresh = path.with_name(path.name + ".new")
    write_retrieval_results(fresh, records)
    if path.is_file() and path.read_bytes() == fresh.read_bytes():
        fresh.unlink()
    else:
        fresh.replace(path)
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
        reused = {}
        for name, extra in (("dpr", {}), ("taser", {"model_type": "taser", "taser": TASER})):
            t = time.perf_counter()
            retrieval = work / f"retriever-{name}" / "eval" / "retrieval.json"
            kept = args.reuse and retrieval.is_file() and _trained_steps(work / f"retriever-{name}") == args.retriever_steps
            if not kept:
                train_and_evaluate(name, {**MINILM, **extra}, train, {**mined, "qa_file": files["qa_file"]}, work / f"retriever-{name}")
            found[f"{name} (trained {args.retriever_steps} steps)"], reused[name] = retrieval, kept
            times[f"{name} retriever: train, encode, index, retrieve" + (" (reused)" if kept else "")] = time.perf_counter() - t
        t = time.perf_counter()
        trained = work / "retriever-dpr"
        found["hybrid (BM25 + trained dpr, λ=1.1)"] = work / "hybrid-dpr" / "retrieval.json"
        kept = args.reuse and found["hybrid (BM25 + trained dpr, λ=1.1)"].is_file() and reused["dpr"]
        if not kept:
            evaluate_hybrid(trained / "final", trained / "index", files["qa_file"], files["passages"], work / "hybrid-dpr", k=100, bm25=bm25)
        times["hybrid with the trained dpr: retrieve" + (" (reused)" if kept else "")] = time.perf_counter() - t
    return found


def _trained_steps(run_dir: Path) -> int | None:
    """The steps of the retriever trained in `run_dir` (its train_log.jsonl's last line), None when there is none."""
    log_file = run_dir / "train_log.jsonl"
    if not log_file.is_file():
        return None
    lines = [line for line in log_file.read_text().splitlines() if line.strip()]
    return json.loads(lines[-1])["step"] if lines else None


READER_KEYS = ("stage", "batch_size", "passages", "max_steps", "learning_rate", "head_learning_rate", "warmup_steps", "seed", "top_n",
               "max_answers")


def _same_reader(reader_dir: Path, train, model_settings) -> bool:
    """Whether `reader_dir` holds a finished reader trained with these settings."""
    summary = reader_dir / "train_summary.json"
    if not (summary.is_file() and (reader_dir / "final" / "model.safetensors").is_file()):
        return False
    found = json.loads(summary.read_text())
    done = found.get("config", {})
    model = found.get("model", {})  # the trained reader's ReaderConfig
    return (all(done.get(key) == getattr(train, key) for key in READER_KEYS)
            and all(model.get(key) == getattr(model_settings, key) for key in ("max_length", "max_answer_length")))


def train_stage(job, reuse: bool, times: dict, label: str) -> tuple[dict, bool]:
    """Train (or, with --reuse, keep) the reader of `job`; (its train_summary.json, whether it was kept)."""
    from taser.pipeline.reader import train_reader

    reader_dir = Path(job.output_dir)
    reused = reuse and _same_reader(reader_dir, job.train, job.model)
    if reused:
        log.info("reusing the reader trained in %s with these settings", reader_dir)
    else:
        train_reader(job)
    summary = json.loads((reader_dir / "train_summary.json").read_text())
    times[f"reader: {label}" + (" (reused)" if reused else "")] = summary["seconds"]
    return summary, reused


def train_readers(args, work: Path, times: dict) -> tuple[Path, dict, dict]:
    """The two stages: reading comprehension on the training questions' gold passages, then the
    open-domain stage on BM25's retrieved passages (the gold passage as the positive)."""
    from taser.reader.config import ReaderModelSettings, ReaderStage, ReaderTrainConfig, TrainReaderJob

    gold = str(work / "data" / "train.json")  # prepare_squad's bi-encoder JSON: the first positive is the gold passage
    common = {"learning_rate": args.lr, "head_learning_rate": args.head_lr, "save_every": 0, "log_every": 25, "progress": False}
    model = {"max_length": args.max_length, "max_answer_length": args.max_answer_length}
    reading = ReaderTrainConfig(stage=ReaderStage.reading, batch_size=args.reading_batch, passages=1, max_steps=args.reading_steps,
                                warmup_steps=max(1, args.reading_steps // 10), **common)
    first = TrainReaderJob(ReaderModelSettings(pretrained="shipped:all-MiniLM-L6-v2", **model), reading, gold_file=gold,
                           output_dir=str(work / "reader-reading"))
    summary_reading, kept = train_stage(first, args.reuse, times, "reading comprehension (gold passages)")
    if not args.steps:
        return work / "reader-reading" / "final", summary_reading, {}
    open_domain = ReaderTrainConfig(batch_size=args.batch, passages=args.passages, max_steps=args.steps, warmup_steps=max(1, args.steps // 10),
                                    **common)
    second = TrainReaderJob(ReaderModelSettings(init_checkpoint=str(work / "reader-reading" / "final"), **model), open_domain,
                            train_file=str(work / "bm25-train" / "retrieval.json"), gold_file=gold, output_dir=str(work / "reader"))
    summary_open, _ = train_stage(second, args.reuse and kept, times, "open-domain (BM25's passages)")  # a new first stage, a new second
    return work / "reader" / "final", summary_reading, summary_open


def paired_em(rows: list, work: Path, baseline: str, k: int) -> list[str]:
    """Each retriever row's EM@k against `baseline`'s, paired by question (exact sign-flip test)."""
    import numpy as np

    from taser.evaluation.per_query import metric_values, read_per_query
    from taser.evaluation.recipes import detectable_difference
    from taser.evaluation.significance import bootstrap_interval, sign_flip_test

    runs = {name: read_per_query(Path(r["out_dir"]) / "per_query.jsonl") for name, r in rows if r.get("out_dir")}
    base = {q["id"]: q for q in runs[baseline]}
    lines = [f"| row | EM@{k} | {baseline}'s EM@{k} | questions | difference (points) | 95% interval | p (exact sign flip) "
             "| smallest difference seen at 80% power |", "|---|---|---|---|---|---|---|---|"]
    for name, records in runs.items():
        if name == baseline:
            continue
        ids = [q["id"] for q in records if q["id"] in base]
        a = metric_values([q for q in records if q["id"] in base], f"EM@{k}")
        b = metric_values([base[i] for i in ids], f"EM@{k}")
        p, how = sign_flip_test(a, b)
        low, high = bootstrap_interval(a - b)
        seen = detectable_difference(float(np.std(a - b, ddof=1)) / np.sqrt(len(ids)), len(ids) - 1)  # paired t at these questions' spread
        lines.append(f"| {name} | {a.mean():.1f} | {b.mean():.1f} | {len(ids)} | {a.mean() - b.mean():+.1f} | [{low:+.1f}, {high:+.1f}] | "
                     f"{p:.2g}{'' if how == 'exact' else f' ({how})'} | {seen:.1f} |")
    return lines


def read_once(job, reuse: bool) -> tuple[dict, bool]:
    """`read(job)`, or with --reuse the results.json an earlier run wrote for the same reader, file and ks (when newer than both)."""
    from taser.pipeline.reader import read

    done = Path(job.out_dir) / "results.json"
    if reuse and done.is_file():
        found = json.loads(done.read_text())
        newer = done.stat().st_mtime > max(Path(job.retrieval).stat().st_mtime, (Path(job.checkpoint) / "model.safetensors").stat().st_mtime)
        if newer and found.get("reader") == job.checkpoint and found.get("ks") == list(job.ks):
            return found, True
    return read(job), False


def main() -> None:
    from taser.data.retrieval_json import read_retrieval_results
    from taser.reader.config import ReadJob

    ap = argparse.ArgumentParser()
    ap.add_argument("--work", type=Path, default=ROOT / "outputs" / "bench-reader")
    ap.add_argument("--reading-steps", type=int, default=1000, help="reading-comprehension stage: steps on the gold passages")
    ap.add_argument("--reading-batch", type=int, default=32, help="questions (each with its gold passage alone) per reading step")
    ap.add_argument("--steps", type=int, default=300, help="open-domain stage: steps on BM25's passages (0: none)")
    ap.add_argument("--batch", type=int, default=4, help="questions per open-domain step")
    ap.add_argument("--passages", type=int, default=8, help="m: passages per question in the open-domain stage (1 positive + m-1 negatives)")
    ap.add_argument("--lr", type=float, default=1e-4, help="the encoder's learning rate")
    ap.add_argument("--head-lr", type=float, default=2e-3, help="the span and selection heads' learning rate")
    ap.add_argument("--max-length", type=int, default=256)
    ap.add_argument("--max-answer-length", type=int, default=10)
    ap.add_argument("--eval-questions", type=int, default=0, help="an evenly spaced sample of the 1,971 evaluation questions (0: all)")
    ap.add_argument("--ks", type=int, nargs="+", default=[1, 5, 20])
    ap.add_argument("--bm25-backend", default="pyserini")
    ap.add_argument("--no-dense", action="store_true", help="BM25 and the oracle only")
    ap.add_argument("--retriever-steps", type=int, default=0, help="> 0: also train dpr and taser retrievers this many steps (the demo: 50)")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results.md")
    ap.add_argument("--reuse", action="store_true",
                    help="keep what --work holds from an earlier run with the same settings (BM25 and zero-shot retrieval, the readers)")
    args = ap.parse_args()
    start = time.perf_counter()
    times: dict[str, float] = {}
    work = args.work
    data = prepare_squad(work).parent
    found = retrievals(args, data, work, times)
    reader, reading, open_domain = train_readers(args, work, times)

    rows = []
    oracle, unmatched = oracle_records(work)
    subset = [r for r in sample(oracle, args.eval_questions) if r["ctxs"]]
    t = time.perf_counter()
    out_dir = work / "read" / "oracle"
    results, kept = read_once(ReadJob(str(reader), str(write_json(work / "eval-sets" / "oracle.json", subset)), str(out_dir), ks=[1],
                                      progress=False), args.reuse)
    times["read: oracle" + (" (reused)" if kept else "")] = results["seconds"] if kept else time.perf_counter() - t
    rows.append(("oracle (gold passage given)", {**results, "out_dir": None}))
    for name, path in found.items():
        slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")  # one directory per row: "hybrid-bm25-trained-dpr-1-1"
        subset = write_json(work / "eval-sets" / f"{slug}.json", sample(read_retrieval_results(path), args.eval_questions))
        t = time.perf_counter()
        out_dir = work / "read" / slug
        results, kept = read_once(ReadJob(str(reader), str(subset), str(out_dir), ks=args.ks, progress=False), args.reuse)
        times[f"read: {name}" + (" (reused)" if kept else "")] = results["seconds"] if kept else time.perf_counter() - t
        rows.append((name, {**results, "out_dir": str(out_dir)}))

    ks = args.ks
    head = ("| passages from | questions | " + " | ".join(f"top-{k}" for k in ks) + " | " + " | ".join(f"EM@{k}" for k in ks)
            + " | F1 (largest k) |\n|" + "---|" * (3 + 2 * len(ks)) + "\n")
    lines = []
    for name, r in rows:
        cells = [r["top_k"].get(str(k)) for k in ks] + [r["em"].get(str(k)) for k in ks] + [r["f1"][str(max(r["ks"]))]]
        lines.append(f"| {name} | {r['questions']} | " + " | ".join("–" if v is None else f"{v:.1f}" for v in cells) + " |")
    tests = "\n".join(paired_em(rows, work, "BM25", ks[0])) if len(rows) > 2 else "(one retriever: nothing to compare)"
    total = time.perf_counter() - start

    def stage(summary: dict, what: str) -> str:
        c = summary["config"]
        return (f"{what}: {summary['steps']} steps of {c['batch_size']} questions x {c['passages']} passage(s), encoder lr {c['learning_rate']:g}, "
                f"heads lr {c['head_learning_rate'] or c['learning_rate']:g} (linear warm-up {c['warmup_steps']} steps, linear decay), "
                f"{summary['seconds']:.0f} s ({summary['median_step_s']:.2f} s/step, precision {summary['runtime']['precision']}); "
                f"{summary['questions']} training questions ({summary.get('gold_positives', 0)} with their gold passage as the positive), "
                f"skipped {summary['skipped']}")

    stages = stage(reading, "Stage 1, reading comprehension (each training question's gold passage alone)")
    if open_domain:
        stages += ".\n\n" + stage(open_domain, "Stage 2, open-domain (from stage 1; BM25's top 100 of each training question: the gold passage "
                                                  f"as the positive, {args.passages - 1} answer-free negatives)")
    text = (
        "# End-to-end QA: DPR's reader on the SQuAD benchmark (shipped data, all-MiniLM-L6-v2, 2 CPU cores)\n\n"
        f"Command: `{command_line(__file__)}`\n\n{machine_line()}\n\n"
        f"Reader: all-MiniLM-L6-v2 encoder + DPR's heads, `[CLS] question [SEP] title [SEP] passage` up to {args.max_length} tokens, "
        f"answer spans up to {args.max_answer_length} subword tokens (recorded in the checkpoint).\n\n{stages}.\n\n"
        f"Evaluation: {rows[-1][1]['questions']} evaluation questions ("
        + ("all of the last 10 articles' 1,971" if not args.eval_questions else "an evenly spaced sample of the last 10 articles' 1,971")
        + f"), over the 2,141 passages; the oracle row reads the gold passage of those whose answer lies in one passage "
        f"({unmatched} of all 1,971 have none). top-k: the retriever's accuracy on the same questions. Whole run: {total / 60:.1f} min.\n\n"
        + head + "\n".join(lines)
        + f"\n\n## EM@{ks[0]} between retrievers, paired by question\n\nOne reader and one retriever of each kind (no seeds): the test is over "
        "questions and speaks of these runs, not of the recipes. Interval: percentile bootstrap over questions.\n\n" + tests
        + "\n\n## Stage times (s)\n\n| stage | seconds |\n|---|---|\n"
        + "".join(f"| {k} | {v:.0f} |\n" for k, v in times.items())
    )
    write_keeping_section(args.out, text, NOTES)  # the notes written by hand survive a re-run
    print(text)


if __name__ == "__main__":
    main()
