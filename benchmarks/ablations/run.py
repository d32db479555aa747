"""The papers' ablations on the shipped SQuAD protocol, at several seeds, with significance (issue 18).

    python benchmarks/ablations/run.py                          # every row, seeds 1 2 3, ~4 h on 2 CPU cores
    python benchmarks/ablations/run.py --rows dpr taser-t2      # some rows (the others keep what they have)
    python benchmarks/ablations/run.py --report-only            # the report of what is finished

Rows (`ROWS`): zero-shot and BM25 (no seed); `shared`; `dpr` (1 BM25 hard negative, in-batch
negatives: the baseline of the negatives axes); `taser` with T = 1, 2, 3 (deterministic FFN
routing), learned sequence and learned token routing, and attention specialised instead of the FFN;
`dpr` with 0 and 2 BM25 hard negatives, without in-batch negatives, and with one round of
dense-mined hard negatives (mined with that seed's trained `dpr`); BM25 + `dpr` hybrid (DPR's rule).
Every trained row uses the same steps, batch, learning rate and seeds, MiniLM's own pooling and
normalisation; a trained row costs its training plus one encoding of the 2,141 passages. The BM25
index and the BM25 negatives are built once and shared; `dpr`'s index serves the hybrid and the
dense mining.

Resumable, across machines and sessions: each finished (row, seed) copies its `results.json`,
`per_query.jsonl` and `times.json` into `benchmarks/ablations/runs/<row>/seed-<s>/` (`--records`),
which is committed with the code; a pair recorded there is skipped, and a killed training continues
from its last checkpoint in `--work` (every `--save-every` steps). Pairs run seed by seed (every row
at seed 1, then seed 2, ...), so a stopped study has every row at the seeds it finished. A row that
uses `dpr`'s model (dense mining, hybrid) retrains that seed's `dpr` when its checkpoint is no longer
in `--work` (training is deterministic at a seed on one machine). `results.md` is rewritten from
every recorded pair at the end of the run (or by `--report-only`, e.g. after a stopped run): the
tables against `dpr`, against zero-shot and against BM25 (mean ± std over seeds, bootstrap intervals
over questions, † = significant after Holm, each row against the baseline seed by seed), the seeds
of each row tested against each other once, the machine, and the command. The section
from "## What the study supports" on is kept across re-runs: it is written by hand.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import BASE_TRAIN, ROOT, SQUAD, command_line, machine_line, write_keeping_section  # noqa: E402

from taser.cli import setup_logging  # noqa: E402

log = logging.getLogger("benchmark.ablations")

TASER = {"specialize": "ffn", "routing": "deterministic", "num_experts": 2}
KEPT_HEADING = "## What the study supports"
KS = (1, 5, 20, 100)  # the report's top-k columns
BASELINES = ("dpr", "zero-shot", "BM25")  # one table each: the trained rows against dpr and zero-shot, the hybrid against BM25
DATASET = "SQuAD"


@dataclass(frozen=True)
class Row:
    key: str  # its directory under <work>/runs
    name: str  # its system name in results.json and the report
    kind: str = "trained"  # trained | zero-shot | bm25 | hybrid
    model: dict = field(default_factory=dict)  # over the base model settings
    train: dict = field(default_factory=dict)  # over the shared training settings
    negatives: str = "bm25"  # trained: bm25 | dense (mined with this seed's dpr)

    @property
    def seeded(self) -> bool:
        return self.kind in ("trained", "hybrid")


ROWS = [
    Row("zero-shot", "zero-shot", "zero-shot", {"model_type": "shared"}),
    Row("bm25", "BM25", "bm25"),
    Row("shared", "shared", model={"model_type": "shared"}),
    Row("dpr", "dpr", model={"model_type": "dpr"}),
    Row("taser-t1", "taser T=1", model={"model_type": "taser", "taser": {**TASER, "specialize_every": 1}}),
    Row("taser-t2", "taser T=2", model={"model_type": "taser", "taser": {**TASER, "specialize_every": 2}}),
    Row("taser-t3", "taser T=3", model={"model_type": "taser", "taser": {**TASER, "specialize_every": 3}}),
    Row("taser-seq", "taser T=2, learned sequence routing",
        model={"model_type": "taser", "taser": {**TASER, "specialize_every": 2, "routing": "learned_sequence", "load_balance_weight": 0.01}}),
    Row("taser-token", "taser T=2, learned token routing",
        model={"model_type": "taser", "taser": {**TASER, "specialize_every": 2, "routing": "learned_token", "load_balance_weight": 0.01}}),
    Row("taser-attention", "taser T=2, attention specialised",
        model={"model_type": "taser", "taser": {**TASER, "specialize_every": 2, "specialize": "attention"}}),
    Row("dpr-0neg", "dpr, 0 BM25 negatives", model={"model_type": "dpr"}, train={"hard_negatives": 0}),
    Row("dpr-2neg", "dpr, 2 BM25 negatives", model={"model_type": "dpr"}, train={"hard_negatives": 2}),
    Row("dpr-no-in-batch", "dpr, no in-batch negatives (1-of-N)", model={"model_type": "dpr"}, train={"in_batch": False}),
    Row("dpr-dense-neg", "dpr, 1 dense-mined negative", model={"model_type": "dpr"}, negatives="dense"),
    Row("hybrid", "hybrid BM25 + dpr", "hybrid"),
]
BY_KEY = {r.key: r for r in ROWS}
NEEDS_DPR = ("dpr-dense-neg", "hybrid")  # use that seed's trained dpr


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", nargs="+", default=[r.key for r in ROWS], choices=[r.key for r in ROWS])
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    p.add_argument("--steps", type=int, default=50, help="training steps per (row, seed)")
    p.add_argument("--batch", type=int, default=16, help="questions per step")
    p.add_argument("--lr", type=float, default=2e-5)
    p.add_argument("--precision", default="auto", help="training and encoding (auto: from the hardware)")
    p.add_argument("--model", default="shipped:all-MiniLM-L6-v2", help="the pretrained encoder (path or shipped:...)")
    p.add_argument("--max-length", type=int, default=None, help="passage tokens (default: the model config's)")
    p.add_argument("--squad", type=Path, default=SQUAD, help="the SQuAD JSON of the protocol")
    p.add_argument("--train-articles", type=int, default=30)
    p.add_argument("--limit-questions", type=int, default=None, help="evaluate only the first N evaluation questions (smoke runs)")
    p.add_argument("--bm25-backend", default="pyserini", choices=["pyserini", "bm25s"])
    p.add_argument("--save-every", type=int, default=25, help="training checkpoints (a killed run resumes from the last)")
    p.add_argument("--resamples", type=int, default=10_000, help="of the significance tests and bootstrap intervals")
    p.add_argument("--keep-checkpoints", action="store_true", help="keep every trained model (default: only dpr's, which later rows use)")
    p.add_argument("--report-only", action="store_true")
    p.add_argument("--work", type=Path, default=ROOT / "outputs" / "benchmarks" / "ablations")
    p.add_argument("--records", type=Path, default=Path(__file__).resolve().parent / "runs",
                   help="finished pairs' results (committed: the study resumes from them anywhere)")
    p.add_argument("--results", type=Path, default=Path(__file__).resolve().parent / "results.md")
    args = p.parse_args(argv)
    rows = list(args.rows)
    for key in NEEDS_DPR:  # a row that uses dpr's checkpoint brings dpr with it
        if key in rows and "dpr" not in rows:
            rows.insert(0, "dpr")
    args.rows = [r.key for r in ROWS if r.key in rows]  # in ROWS' order: dpr before the rows that use it
    return args


def prepare(args) -> dict:
    """The protocol's data (converted once) and BM25 hard negatives (mined once), with the shared BM25 index."""
    from taser.data.squad import convert_squad
    from taser.pipeline.mine import mine_negatives

    data_dir = args.work / "data"
    if not (data_dir / "summary.json").is_file():
        convert_squad(args.squad, data_dir, train_articles=args.train_articles)
    bm25 = {"backend": args.bm25_backend, "index_dir": str(args.work / f"bm25-{args.bm25_backend}")}
    mined = data_dir / f"train.bm25-{args.bm25_backend}.json"
    if not mined.is_file():
        mine_negatives(data_dir / "train.json", data_dir / "passages.tsv", mined, retriever="bm25", top_n=100, num_hard_negatives=30, bm25=bm25,
                       progress=False)
    qa_file = data_dir / "dev.qa.tsv"
    if args.limit_questions:
        from taser.data.qa import read_qa, write_qa

        subset = data_dir / f"dev.first{args.limit_questions}.qa.tsv"
        if not subset.is_file():
            write_qa(subset, list(read_qa(qa_file))[: args.limit_questions])
        qa_file = subset
    return {"passages": str(data_dir / "passages.tsv"), "qa_file": str(qa_file), "train": str(data_dir / "train.json"),
            "bm25_train": str(mined), "bm25": bm25}


def model_settings(args, row: Row) -> dict:
    base = {"pretrained": args.model, "pooling": "auto", "normalize": "auto", **row.model}
    if args.max_length:
        base.update(max_length=args.max_length, max_question_length=min(args.max_length, 64))
    return base


def train_settings(args, row: Row, seed: int) -> dict:
    return {**BASE_TRAIN, "batch_size": args.batch, "learning_rate": args.lr, "warmup_steps": max(1, args.steps // 10), "max_steps": args.steps,
            "precision": args.precision, "seed": seed, "name": row.name, "save_every": args.save_every, "resume": True, **row.train}


def run_dir(args, row: Row, seed: int | None) -> Path:
    return args.work / "runs" / row.key / (f"seed-{seed}" if seed is not None else "no-seed")


def dpr_dir(args, seed: int) -> Path:
    return run_dir(args, BY_KEY["dpr"], seed)


def run_pair(args, data: dict, row: Row, seed: int | None) -> dict:
    """Train (when the row trains), encode and evaluate one (row, seed); returns its stage times."""
    from taser.pipeline.evaluate import evaluate_bm25, evaluate_dense, evaluate_hybrid
    from taser.pipeline.experiment import save_initial
    from taser.pipeline.mine import mine_negatives
    from taser.pipeline.train import run_training

    out = run_dir(args, row, seed)
    times: dict[str, float] = {}
    qa = {"qa_file": data["qa_file"], "passages_tsv": data["passages"], "dataset": DATASET}
    t = time.perf_counter()
    if row.kind == "bm25":
        evaluate_bm25(out_dir=out / "eval", bm25=data["bm25"], name=row.name, **qa)
    elif row.kind == "zero-shot":
        initial = out / "initial"
        if not (initial / "model.safetensors").is_file():
            save_initial(model_settings(args, row), out)
        evaluate_dense(initial, None, out_dir=out / "eval", precision=args.precision, name=row.name, **qa)
    elif row.kind == "hybrid":
        dpr = dpr_dir(args, seed)
        evaluate_hybrid(dpr / "final", dpr / "eval" / "dense-index" / "index", out_dir=out / "eval", bm25=data["bm25"], precision=args.precision,
                        name=row.name, **qa)
    else:
        train_file = data["bm25_train"]
        if row.negatives == "dense":
            dpr = dpr_dir(args, seed)
            mined = out / "train.dense.json"
            if not mined.is_file():
                mine_negatives(data["train"], data["passages"], mined, retriever="dense", checkpoint=dpr / "final",
                               index=dpr / "eval" / "dense-index" / "index", top_n=100, num_hard_negatives=30, precision=args.precision, progress=False)
            times["mine"] = time.perf_counter() - t
            t = time.perf_counter()
            train_file = str(mined)
        if not (out / "train_summary.json").is_file():
            run_training(model_settings(args, row), [train_file], train_settings(args, row, seed), out)
        times["train"] = time.perf_counter() - t
        t = time.perf_counter()
        evaluate_dense(out / "final", None, out_dir=out / "eval", precision=args.precision, name=row.name, **qa)
        shutil.rmtree(out / "checkpoint", ignore_errors=True)  # the resumable state: done with
        if not args.keep_checkpoints and row.key != "dpr":
            shutil.rmtree(out / "final", ignore_errors=True)
    times["evaluate"] = time.perf_counter() - t
    return times


def pairs(args) -> list[tuple[Row, int | None]]:
    """Unseeded rows first, then every row at the first seed, then at the next: a study stopped
    part-way has all its rows at the seeds it finished."""
    rows = [BY_KEY[key] for key in args.rows]
    return [(row, None) for row in rows if not row.seeded] + [(row, seed) for seed in args.seeds for row in rows if row.seeded]


def record_dir(args, row: Row, seed: int | None) -> Path:
    return args.records / row.key / (f"seed-{seed}" if seed is not None else "no-seed")


def finished(args, row: Row, seed: int | None) -> bool:
    return (record_dir(args, row, seed) / "results.json").is_file()


RECORDED = ("results.json", "per_query.jsonl")


def record(args, row: Row, seed: int | None, times: dict) -> None:
    """Copy a finished pair's evaluation into the records (results.json last: it marks the pair done)."""
    source = run_dir(args, row, seed) / "eval"
    target = record_dir(args, row, seed)
    target.mkdir(parents=True, exist_ok=True)
    (target / "times.json").write_text(json.dumps(times) + "\n")
    for name in reversed(RECORDED):
        tmp = target / f".{name}.tmp"
        shutil.copyfile(source / name, tmp)
        tmp.replace(target / name)


def ensure_dpr(args, data: dict, seed: int) -> None:
    """That seed's trained `dpr` and its index in `--work`, retrained when a new machine or a
    cleaned work directory lost them (the recorded results stay as they are)."""
    dpr = dpr_dir(args, seed)
    if (dpr / "final" / "model.safetensors").is_file() and (dpr / "eval" / "dense-index" / "index").exists():
        return
    log.info("dpr, seed %s: its model is not in %s; training it again for the rows that use it", seed, args.work)
    shutil.rmtree(dpr, ignore_errors=True)
    run_pair(args, data, BY_KEY["dpr"], seed)


def write_results(args) -> str:
    """`results.md` from every finished (row, seed) under the work directory."""
    from taser.evaluation.comparison import StatsSettings
    from taser.evaluation.report import plot_curves, plot_file_name, read_runs, report_markdown, seed_checks_markdown, table_stats

    done = [(row, seed) for row in ROWS for seed in (args.seeds if row.seeded else [None]) if finished(args, row, seed)]
    if not done:
        return ""
    runs = read_runs([record_dir(args, row, seed) / "results.json" for row, seed in done])
    names = {r.system for r in runs}
    plot = plot_curves(runs, DATASET, args.results.parent / plot_file_name(DATASET))
    times = {}
    for row, seed in done:
        recorded = record_dir(args, row, seed) / "times.json"
        if recorded.is_file():
            times.setdefault(row.name, []).append(json.loads(recorded.read_text()))
    total = sum(sum(t.values()) for per_row in times.values() for t in per_row)
    # a pair slowed by another job on the machine inflates the sum; each row's median pair, times its pairs, does not
    typical = sum(statistics.median(sum(t.values()) for t in per_row) * len(per_row) for per_row in times.values())
    seeds_done = sorted({seed for _, seed in done if seed is not None})
    text = [
        "# Ablations with seeds and significance on the SQuAD benchmark (shipped data)\n",
        f"Command: `{command_line(__file__, [a for a in args.argv if a != '--report-only'])}` (resumes where it stopped; add "
        "`--report-only` to rewrite this file from the records)\n",
        machine_line(args.precision) + "\n",
        f"Model: `{args.model}` (pooling and normalisation: the checkpoint's own). Every trained row: {args.steps} steps of {args.batch} "
        f"questions, lr {args.lr:g}, warm-up {max(1, args.steps // 10)}, grad clip {BASE_TRAIN['grad_clip']}, 1 BM25 hard negative per question "
        f"unless the row says otherwise (BM25: {args.bm25_backend}, k1 0.9, b 0.4, top-100 without an answer, mined once), "
        f"seeds {', '.join(map(str, seeds_done)) or '–'}. Evaluation: the questions of the last articles against every passage "
        f"(answer match, top-k %)" + (f", only the first {args.limit_questions} (smoke run)" if args.limit_questions else "") + ". "
        f"Rows finished: {len(done)} (row, seed) pairs; their summed time: {total / 3600:.2f} h as recorded, "
        f"{typical / 3600:.2f} h at each row's median pair (the recorded times include pairs slowed by other jobs).\n",
    ]
    first = None
    for baseline in BASELINES:
        if baseline not in names:
            continue
        stats = StatsSettings(baseline=baseline, resamples=args.resamples)
        comparison = table_stats(runs, KS, stats=stats, reuse=first)  # the intervals are drawn once, for the first baseline
        first = first or comparison
        body = report_markdown(runs, {}, ks=KS, title=f"Against {baseline}", comparison=comparison, seed_checks=False)
        text.append("#" + body.replace("\n## ", "\n### "))
    checks = seed_checks_markdown(runs, StatsSettings(resamples=args.resamples), ks=KS)
    if checks:
        text.append(checks)
    if plot:
        text.append(f"![top-k accuracy, mean over seeds, shaded min-max]({plot.name})\n")
    if times:
        text.append("## Time per row (median over seeds, s)\n\n| row | " + " | ".join(["train", "evaluate", "mine"]) + " |\n|---|---|---|---|\n"
                    + "".join(f"| {name} | " + " | ".join(_median_of(per_row, k) for k in ("train", "evaluate", "mine")) + " |\n"
                              for name, per_row in times.items()))
    body = "\n".join(text)
    args.results.parent.mkdir(parents=True, exist_ok=True)
    write_keeping_section(args.results, body, KEPT_HEADING)
    return body


def _median_of(records: list[dict], key: str) -> str:
    values = [r[key] for r in records if key in r]
    return f"{statistics.median(values):.0f}" if values else "–"


def main(argv=None) -> str:
    args = parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else list(argv)
    setup_logging()
    if not args.report_only:
        data = prepare(args)
        todo = [(row, seed) for row, seed in pairs(args) if not finished(args, row, seed)]
        log.info("%d (row, seed) pairs to run, %d finished already", len(todo), len(pairs(args)) - len(todo))
        for row, seed in todo:
            log.info("=== %s, seed %s ===", row.name, seed)
            if row.key in NEEDS_DPR:
                ensure_dpr(args, data, seed)
            times = run_pair(args, data, row, seed)
            record(args, row, seed, times)  # the report is written once, at the end (or by --report-only): its tests take minutes
    text = write_results(args)
    print(text)
    return text


if __name__ == "__main__":
    main()
