"""The papers' ablations on the shipped SQuAD protocol, at several seeds, with significance (issue 18):
the table preset `configs/table/squad_cpu.yaml` run pair by pair (`taser.pipeline.rows`), plus the report.

    python benchmarks/ablations/run.py                          # every row, seeds 1 2 3, ~4 h on 2 idle CPU cores
    python benchmarks/ablations/run.py --rows dpr taser-t2      # some rows (the others keep what they have)
    python benchmarks/ablations/run.py --rows dpr --seeds 4 5   # more seeds of a row
    python benchmarks/ablations/run.py --report-only            # the report of every recorded pair

The committed results.md holds 51 recorded pairs: seeds 1-5 of `shared`, `dpr`, `taser-t2`,
`dpr-0neg` and `dpr-no-in-batch`, seeds 1-3 of the eight other trained rows, zero-shot and BM25.
Its hours: seeds 1-3 about 4 h on 2 idle cores of an AVX2 AMD EPYC (seed 3 ran alone in 1.31 h by
its `times.json`; three seeds at that rate, with zero-shot and BM25), seeds 4-5 of those five rows
31 minutes on an Intel Xeon; the recorded times sum to 7.48 h, inflated by pairs that ran beside
other jobs (results.md, "Time").

Rows (`ROWS`, read from the preset, whose settings they run): zero-shot and BM25 (no seed); `shared`; `dpr` (1 BM25 hard negative, in-batch
negatives: the baseline of the negatives axes); `taser` with T = 1, 2, 3 (deterministic FFN
routing), learned sequence and learned token routing, and attention specialised instead of the FFN;
`dpr` with 0 and 2 BM25 hard negatives, without in-batch negatives, and with one round of
dense-mined hard negatives (mined with that seed's trained `dpr`); BM25 + `dpr` hybrid (DPR's rule).
Every trained row uses the same steps, batch, learning rate and seeds, MiniLM's own pooling and
normalisation; a trained row costs its training plus one encoding of the 2,141 passages. Every stage
lives in the stage store (`--work`/stages, keyed by its settings and inputs): the BM25 index and the
BM25 negatives are built once and shared; `dpr`'s model and index serve the hybrid and the dense
mining. The same table runs as `python scripts/experiment.py -m table=squad_cpu` (one Hydra job per
pair, on any launcher); this script keeps the committed records and results.md.

Resumable, across machines and sessions: each finished (row, seed) copies its `results.json`,
`per_query.jsonl` and `times.json` into `benchmarks/ablations/runs/<row>/seed-<s>/` (`--records`),
which is committed with the code; a pair recorded there is skipped, and a killed training continues
from its last checkpoint in `--work` (every `--save-every` steps). Pairs run seed by seed (every row
at seed 1, then seed 2, ...), so a stopped study has every row at the seeds it finished. A row that
uses `dpr`'s model (dense mining, hybrid) finds it in the stage store, or trains that seed's `dpr`
again when the store no longer has it (training is deterministic at a seed on one machine). `results.md` is rewritten from
every recorded pair at the end of the run (or by `--report-only`, e.g. after a stopped run), at
every seed recorded for each row whatever `--seeds` says (`--seeds` is what a run trains; given
with `--report-only` it restricts the report to those seeds, and the file says so); a rewrite that
changes the file logs a warning with the changed lines and whether figures moved. It holds the
tables against `dpr`, against zero-shot and against BM25 (mean ± std over seeds, bootstrap intervals
over questions, † = significant after Holm's correction over the three tables as one family, a comparison
shown in two tables counted once (`--family table`: each table its own), each row against the baseline seed by seed), the seeds
of each row tested against each other once, the machine, and the command (its `--seeds`: those
asked for and those the file holds, so it reproduces the file). The section
from "## What the study supports" on is kept across re-runs: it is written by hand.
"""

from __future__ import annotations

import argparse
import difflib
import json
import logging
import re
import shutil
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import BASE_TRAIN, ROOT, SQUAD, command_line, recorded_machine_line, write_keeping_section  # noqa: E402

from taser.cli import setup_logging  # noqa: E402

log = logging.getLogger("benchmark.ablations")

PRESET = "squad_cpu"  # configs/table/squad_cpu.yaml: the rows and their settings
KEPT_HEADING = "## What the study supports"
KS = (1, 5, 20, 100)  # the report's top-k columns
BASELINES = ("dpr", "zero-shot", "BM25")  # one table each: the trained rows against dpr and zero-shot, the hybrid against BM25
DATASET = "SQuAD"
DEFAULT_SEEDS = (1, 2, 3)  # the seeds a training run runs when --seeds is not given


@dataclass(frozen=True)
class Row:
    key: str  # the preset's row key: its directory under the records
    name: str  # its system name in results.json and the report
    seeded: bool  # trained (or fused with a trained row): one result per seed


def _preset_rows() -> list[Row]:
    import yaml

    rows = yaml.safe_load((ROOT / "configs" / "table" / f"{PRESET}.yaml").read_text())["table"]["rows"]
    return [Row(key, row["name"], row.get("kind", "trained") in ("trained", "hybrid")) for key, row in rows.items()
            if row.get("kind") != "reader"]  # the reader rows are benchmarks/reader/'s


ROWS = _preset_rows()
BY_KEY = {r.key: r for r in ROWS}
TITLE = "Ablations with seeds and significance on the SQuAD benchmark (shipped data)"
SCRIPT = __file__  # the command the report names


def use_study(preset: str, title: str, baselines: tuple[str, ...], script: str, default_dir: Path) -> None:
    """Run another preset of the same protocol with this runner (benchmarks/dpr_cpu/run.py): its rows, its
    report's title and baselines, the command its report names, and where its records and results go."""
    global PRESET, ROWS, BY_KEY, TITLE, BASELINES, SCRIPT, DEFAULT_DIR
    PRESET, TITLE, BASELINES, SCRIPT, DEFAULT_DIR = preset, title, baselines, script, default_dir
    ROWS = _preset_rows()
    BY_KEY = {r.key: r for r in ROWS}


DEFAULT_DIR = Path(__file__).resolve().parent  # runs/ and results.md


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", nargs="+", default=[r.key for r in ROWS], choices=[r.key for r in ROWS])
    p.add_argument("--seeds", nargs="+", type=int, default=None,
                   help=f"the seeds to run (default: {' '.join(map(str, DEFAULT_SEEDS))}); the report holds every recorded seed "
                        "whatever they are, except with --report-only, where --seeds given restricts it to these")
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
    p.add_argument("--family", choices=["study", "table"], default="study",
                   help="what Holm's correction runs over: every comparison of the report's tables as one family (a comparison in "
                        "two tables counted once), or each table on its own (named under each table)")
    p.add_argument("--report-only", action="store_true")
    p.add_argument("--work", type=Path, default=ROOT / "outputs" / "benchmarks" / DEFAULT_DIR.name)
    p.add_argument("--records", type=Path, default=DEFAULT_DIR / "runs",
                   help="finished pairs' results (committed: the study resumes from them anywhere)")
    p.add_argument("--results", type=Path, default=DEFAULT_DIR / "results.md")
    args = p.parse_args(argv)
    args.rows = [r.key for r in ROWS if r.key in args.rows]  # in the preset's order
    args.seeds_given = args.seeds is not None
    args.seeds = list(DEFAULT_SEEDS) if args.seeds is None else args.seeds
    return args


def job_for(args, row: Row, seed: int | None):
    """The preset's job for (row, seed) with this run's settings (steps, batch, model, ...) as overrides."""
    from hydra import compose, initialize_config_dir

    from taser.cli import CONFIG_DIR, typed

    seeds = list(args.seeds)
    overrides = [f"table={PRESET}", f"row={row.key}", f"seed={seed if seed is not None else seeds[0]}", f"table.seeds=[{','.join(map(str, seeds))}]",
                 f"table.model.pretrained={args.model}", f"table.train.max_steps={args.steps}", f"table.train.batch_size={args.batch}",
                 f"table.train.learning_rate={args.lr}", f"table.train.warmup_steps={max(1, args.steps // 10)}",
                 f"table.train.save_every={args.save_every}", f"++table.train.precision={args.precision}", f"table.evaluate.precision={args.precision}",
                 f"table.evaluate.bm25.backend={args.bm25_backend}", f"table.data.squad_json={args.squad}",
                 f"table.data.train_articles={args.train_articles}", f"stages_dir={args.work / 'stages'}", f"out_dir={run_dir(args, row, seed)}"]
    if args.max_length:
        overrides += [f"++table.model.max_length={args.max_length}", f"++table.model.max_question_length={min(args.max_length, 64)}"]
    if args.limit_questions:
        overrides.append(f"table.data.limit_questions={args.limit_questions}")
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return typed(compose("experiment", overrides=overrides))


def run_dir(args, row: Row, seed: int | None) -> Path:
    return args.work / "runs" / row.key / (f"seed-{seed}" if seed is not None else "no-seed")


def run_pair(args, row: Row, seed: int | None) -> dict:
    """Every stage of one (row, seed), found in the stage store or built; returns its stage times."""
    from taser.pipeline.rows import run_row

    record = run_row(job_for(args, row, seed))
    times: dict[str, float] = {}
    for stage in record["stages"]:
        kind = stage["key"].split("-")[0]
        part = {"train": "train", "negatives": "mine"}.get(kind, "evaluate")
        if stage["built"]:
            times[part] = times.get(part, 0.0) + stage["seconds"]
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


def recorded_seeds(args, row: Row) -> list[int | None]:
    """Every seed recorded for `row` under the records (`<row>/seed-<s>/results.json`), in order;
    [None] for an unseeded row that is recorded."""
    if not row.seeded:
        return [None] if finished(args, row, None) else []
    directory = args.records / row.key
    if not directory.is_dir():
        return []
    found = (d.name.removeprefix("seed-") for d in directory.glob("seed-*"))
    return sorted(int(s) for s in found if s.isdigit() and finished(args, row, int(s)))


def report_pairs(args) -> list[tuple[Row, int | None]]:
    """The (row, seed) pairs the report holds: every pair recorded, at every seed recorded for its
    row (not only this run's seeds: a report from the default seeds would drop the others); only
    the seeds of `--seeds` when they are given with `--report-only`."""
    restrict = args.report_only and args.seeds_given
    return [(row, seed) for row in ROWS for seed in recorded_seeds(args, row) if seed is None or not restrict or seed in args.seeds]


def _is_option(token: str, name: str) -> bool:
    """Whether `token` is the option `name` (`--seeds`), abbreviated as argparse allows, or `name=...`."""
    given = token.split("=", 1)[0]
    return token.startswith("--") and len(given) > 4 and name.startswith(given)


def report_command(args, seeds_held: list[int]) -> str:
    """The command the report names: this one without `--report-only`, its seeds those it was asked
    for and those the report holds (so it reproduces the file and resumes what stopped), named
    unless they are the default."""
    argv, seeds_at = [], None
    tokens = list(args.argv)
    while tokens:
        token = tokens.pop(0)
        if _is_option(token, "--report-only"):
            continue
        if _is_option(token, "--seeds"):
            seeds_at = len(argv) if seeds_at is None else seeds_at
            while "=" not in token and tokens and not tokens[0].startswith("-"):
                tokens.pop(0)
            continue
        argv.append(token)
    seeds = sorted(set(seeds_held) | set(args.seeds))
    if args.seeds_given or seeds != list(DEFAULT_SEEDS):
        at = len(argv) if seeds_at is None else seeds_at
        argv[at:at] = ["--seeds", *map(str, seeds)]
    return command_line(SCRIPT, argv)


_FIGURE = re.compile(r"[-−+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?")


def report_changes(old: str, new: str) -> list[str]:
    """What rewriting `old` as `new` changes: unified-diff hunks without context (`@@ -l +l @@`
    naming the lines, then `-old` and `+new` lines); empty when nothing changes."""
    return [line for line in difflib.unified_diff(old.splitlines(), new.splitlines(), "before", "after", lineterm="", n=0)
            if not line.startswith(("--- before", "+++ after"))]


def warn_changes(path: Path, old: str, new: str, shown: int = 40) -> list[str]:
    """Say loudly what a rewrite of `path` changed against the file it replaced (figures first of all)."""
    changes = report_changes(old, new)
    if not changes:
        return changes
    removed = [line[1:] for line in changes if line.startswith("-")]
    added = [line[1:] for line in changes if line.startswith("+")]
    figures = sorted(_FIGURE.findall("\n".join(removed))) != sorted(_FIGURE.findall("\n".join(added)))
    more = f"\n... and {len(changes) - shown} more diff lines" if len(changes) > shown else ""
    log.warning("%s now differs from the file it replaced: %d line(s) removed, %d added, %s (git diff %s shows them all):\n%s%s",
                path, len(removed), len(added), "its FIGURES CHANGED" if figures else "no figure changed", path,
                "\n".join(changes[:shown]), more)
    return changes


RECORDED = ("results.json", "per_query.jsonl")


def record(args, row: Row, seed: int | None, times: dict) -> None:
    """Copy a finished pair's evaluation into the records (results.json last: it marks the pair done)."""
    from taser.pipeline.rows import RETRIEVAL_DIR

    source = run_dir(args, row, seed) / RETRIEVAL_DIR
    target = record_dir(args, row, seed)
    target.mkdir(parents=True, exist_ok=True)
    (target / "times.json").write_text(json.dumps(times) + "\n")
    for name in reversed(RECORDED):
        tmp = target / f".{name}.tmp"
        shutil.copyfile(source / name, tmp)
        tmp.replace(target / name)


def write_results(args) -> str:
    """`results.md` from every finished (row, seed) under the work directory."""
    from taser.evaluation.comparison import StatsSettings
    from taser.evaluation.curves import plot_curves, plot_file_name
    from taser.evaluation.report import read_runs, report_markdown, seed_checks_markdown, tables_against
    from taser.evaluation.runs import machine_of

    done = report_pairs(args)
    if not done:
        return ""
    runs = read_runs([record_dir(args, row, seed) / "results.json" for row, seed in done])
    plot = plot_curves(runs, DATASET, args.results.parent / plot_file_name(DATASET))
    times, by_seed = {}, {}
    for row, seed in done:
        recorded = record_dir(args, row, seed) / "times.json"
        if recorded.is_file():
            times.setdefault(row.name, []).append(json.loads(recorded.read_text()))
            machine = machine_of(json.loads((record_dir(args, row, seed) / "results.json").read_text())) or "not recorded"
            by_seed.setdefault((seed, machine), []).append(sum(times[row.name][-1].values()))
    total = sum(sum(t.values()) for per_row in times.values() for t in per_row)
    # a pair slowed by another job on the machine inflates the sum; each row's median pair, times its pairs, does not
    typical = sum(statistics.median(sum(t.values()) for t in per_row) * len(per_row) for per_row in times.values())
    seeds_done = sorted({seed for _, seed in done if seed is not None})
    left_out = sorted({seed for row in ROWS if row.seeded for seed in recorded_seeds(args, row)} - set(seeds_done))
    seeds_note = f" (only those of --seeds; the records also hold seed(s) {', '.join(map(str, left_out))})" if left_out else ""
    text = [
        f"# {TITLE}\n",
        f"Command: `{report_command(args, seeds_done)}` (resumes where it stopped; add "
        "`--report-only` to rewrite this file from the records)\n",
        recorded_machine_line(record_dir(args, row, seed) / "results.json" for row, seed in done) + "\n",  # where the records were made
        f"Model: `{args.model}` (pooling and normalisation: the checkpoint's own). Every trained row: {args.steps} steps of {args.batch} "
        f"questions, lr {args.lr:g}, warm-up {max(1, args.steps // 10)}, grad clip {BASE_TRAIN['grad_clip']}, 1 BM25 hard negative per question "
        f"unless the row says otherwise (BM25: {args.bm25_backend}, k1 0.9, b 0.4, top-100 without an answer, mined once), "
        f"seeds {', '.join(map(str, seeds_done)) or '–'}{seeds_note}. Evaluation: the questions of the last articles against every passage "
        f"(answer match, top-k %)" + (f", only the first {args.limit_questions} (smoke run)" if args.limit_questions else "") + ". "
        f"Rows finished: {len(done)} (row, seed) pairs; their summed time: {total / 3600:.2f} h as recorded, "
        f"{typical / 3600:.2f} h at each row's median pair (the recorded times include pairs slowed by other jobs).\n",
    ]
    comparisons = tables_against(runs, BASELINES, KS, family=args.family, resamples=args.resamples)
    for baseline, comparison in comparisons.items():
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
        text.append(time_by_seed(by_seed))
    body = "\n".join(text)
    args.results.parent.mkdir(parents=True, exist_ok=True)
    old = args.results.read_text() if args.results.is_file() else None
    write_keeping_section(args.results, body, KEPT_HEADING)
    if old is not None:
        warn_changes(args.results, old, args.results.read_text())
    return body


def time_by_seed(by_seed: dict) -> str:
    """Each (seed, machine): its recorded pairs, their summed time and the fastest and slowest pair,
    the figures a hand-written paragraph about time quotes."""
    lines = ["| seed | machine | pairs | summed (h) | fastest – slowest pair (min) |", "|---|---|---|---|---|"]
    for (seed, machine), seconds in sorted(by_seed.items(), key=lambda item: (item[0][0] is None, item[0][0] or 0, item[0][1])):
        lines.append(f"| {'–' if seed is None else seed} | {machine} | {len(seconds)} | {sum(seconds) / 3600:.2f} | "
                     f"{min(seconds) / 60:.1f} – {max(seconds) / 60:.1f} |")
    return ("### Time by seed and machine\n\n" + "\n".join(lines) + "\n\nEach (row, seed) pair's recorded time (training, evaluation, "
            "mining: `times.json`), summed per seed; a pair that ran beside other jobs, or was paused, counts as recorded.\n")


def _median_of(records: list[dict], key: str) -> str:
    values = [r[key] for r in records if key in r]
    return f"{statistics.median(values):.0f}" if values else "–"


def main(argv=None) -> str:
    args = parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else list(argv)
    setup_logging()
    if not args.report_only:
        todo = [(row, seed) for row, seed in pairs(args) if not finished(args, row, seed)]
        log.info("%d (row, seed) pairs to run, %d finished already", len(todo), len(pairs(args)) - len(todo))
        for row, seed in todo:
            log.info("=== %s, seed %s ===", row.name, seed)
            times = run_pair(args, row, seed)
            record(args, row, seed, times)  # the report is written once, at the end (or by --report-only): its tests take minutes
    text = write_results(args)
    print(text)
    return text


if __name__ == "__main__":
    main()
