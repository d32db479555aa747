"""End-to-end QA on the shipped SQuAD protocol with seeds (issue 48): the reader rows of the table
preset `configs/table/squad_cpu.yaml` (a reader trained on the passages of BM25, `dpr`, `taser T=2`
and the BM25 + `dpr` hybrid), run pair by pair (`taser.pipeline.rows`), plus the report.

    python benchmarks/reader/run.py                                  # every reader row, seeds 1 2 3
    python benchmarks/reader/run.py --rows reader-bm25 --seeds 1     # some pairs (the others keep what they have)
    python benchmarks/reader/run.py --report-only                    # results.md from every recorded pair

The same stages as `python scripts/experiment.py -m table=squad_cpu row=reader-bm25,reader-dpr,reader-taser,reader-hybrid seed=1,2,3`
(the preset's reader recipe: a reading-comprehension stage on the training questions' gold passages,
shared by every row and seed, then the open-domain stage per row and seed on its retriever's top
100; the retrievers are the preset's own rows at that seed). Each finished (row, seed) copies its
reader's `results.json`, `per_query.jsonl`, `predictions.json` and `times.json` into
`benchmarks/reader/runs/<row>/seed-<s>/` (committed: the study resumes from them on any machine, in
another session); a pair recorded there is skipped. `results.md` is rewritten from every recorded
pair: EM@k and F1 per row (mean ± std over seeds), the retriever's top-k on the same questions, the
seed-aware test of each row against the reader on BM25, the smallest difference it can see, and the
time of each stage on the CPU that ran it. The section from "## What the figures mean" on is written by hand and kept.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import ROOT, SQUAD, command_line, recorded_machine_line, write_keeping_section  # noqa: E402

from taser.cli import setup_logging  # noqa: E402

log = logging.getLogger("benchmark.reader")

PRESET = "squad_cpu"
KEPT_HEADING = "## What the figures mean"
BASELINE_ROW = "reader-bm25"
DATASET = "SQuAD"
RECORDED = ("results.json", "per_query.jsonl", "predictions.json")  # results.json last: it marks the pair done


def reader_rows() -> dict[str, str]:
    """The preset's reader rows: key -> system name."""
    import yaml

    rows = yaml.safe_load((ROOT / "configs" / "table" / f"{PRESET}.yaml").read_text())["table"]["rows"]
    return {key: row["name"] for key, row in rows.items() if row.get("kind") == "reader"}


ROWS = reader_rows()


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", nargs="+", default=list(ROWS), choices=list(ROWS))
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    p.add_argument("--precision", default="auto", help="training, encoding and reading (auto: from the hardware)")
    p.add_argument("--bm25-backend", default="pyserini", choices=["pyserini", "bm25s"])
    p.add_argument("--squad", type=Path, default=SQUAD)
    p.add_argument("--set", nargs="*", default=[], metavar="OVERRIDE",
                   help="more Hydra overrides of the preset (smoke runs: smaller models and steps); named in results.md")
    p.add_argument("--resamples", type=int, default=10_000, help="of the significance tests and bootstrap intervals")
    p.add_argument("--report-only", action="store_true")
    p.add_argument("--work", type=Path, default=ROOT / "outputs" / "benchmarks" / "reader")
    p.add_argument("--records", type=Path, default=Path(__file__).resolve().parent / "runs")
    p.add_argument("--results", type=Path, default=Path(__file__).resolve().parent / "results.md")
    args = p.parse_args(argv)
    args.rows = [r for r in ROWS if r in args.rows]
    return args


def job_for(args, row: str, seed: int):
    from hydra import compose, initialize_config_dir

    from taser.cli import CONFIG_DIR, typed

    overrides = [f"table={PRESET}", f"row={row}", f"seed={seed}", f"table.seeds=[{','.join(map(str, args.seeds))}]",
                 f"++table.train.precision={args.precision}", f"table.evaluate.precision={args.precision}", f"table.read.precision={args.precision}",
                 f"++table.reader_training.reading.precision={args.precision}", f"++table.reader_training.open_domain.precision={args.precision}",
                 f"table.evaluate.bm25.backend={args.bm25_backend}", f"table.data.squad_json={args.squad}", f"stages_dir={args.work / 'stages'}",
                 f"out_dir={args.work / 'runs' / row / f'seed-{seed}'}", *args.set]
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return typed(compose("experiment", overrides=overrides))


def record_dir(args, row: str, seed: int) -> Path:
    return args.records / row / f"seed-{seed}"


def finished(args, row: str, seed: int) -> bool:
    return (record_dir(args, row, seed) / "results.json").is_file()


def run_pair(args, row: str, seed: int) -> None:
    """Every stage of (row, seed), found in the stage store or built; its reader's files copied into the records."""
    from taser.pipeline.rows import READER_DIR, run_row

    record = run_row(job_for(args, row, seed))
    times = {s["stage"]: round(s["seconds"], 1) for s in record["stages"] if s["built"]}
    source, target = Path(record["job"]["out_dir"]) / READER_DIR, record_dir(args, row, seed)
    target.mkdir(parents=True, exist_ok=True)
    (target / "times.json").write_text(json.dumps(times, indent=1) + "\n")
    for name in RECORDED:
        tmp = target / f".{name}.tmp"
        shutil.copyfile(source / name, tmp)
        tmp.replace(target / name)


def recorded(args) -> list[tuple[str, int]]:
    pairs = []
    for row in ROWS:
        for seed_dir in sorted((args.records / row).glob("seed-*")) if (args.records / row).is_dir() else []:
            seed = seed_dir.name.removeprefix("seed-")
            if seed.isdigit() and finished(args, row, int(seed)):
                pairs.append((row, int(seed)))
    return sorted(pairs, key=lambda p: (list(ROWS).index(p[0]), p[1]))


def write_results(args) -> str:
    from taser.evaluation.comparison import StatsSettings
    from taser.evaluation.report import read_runs, report_markdown

    done = recorded(args)
    if not done:
        return ""
    runs = read_runs([record_dir(args, row, seed) / "results.json" for row, seed in done])
    results = {pair: json.loads((record_dir(args, *pair) / "results.json").read_text()) for pair in done}
    ks = sorted({k for r in results.values() for k in r["ks"]})
    seeds = sorted({seed for _, seed in done})
    baseline = ROWS[BASELINE_ROW]
    body = report_markdown(runs, {}, ks=ks, title="Readers by retriever", stats=StatsSettings(baseline=baseline, resamples=args.resamples))
    times: dict[str, dict[tuple[str, str], list[float]]] = {}  # stage -> (row, CPU) -> seconds: pairs ran on different machines
    for pair in done:
        path = record_dir(args, *pair) / "times.json"
        cpu = (results[pair].get("hardware") or {}).get("cpu", "not recorded")
        for stage, seconds in (json.loads(path.read_text()) if path.is_file() else {}).items():
            times.setdefault(stage, {}).setdefault((ROWS[pair[0]], cpu), []).append(seconds)
    settings = f" Overrides of the preset: `{' '.join(args.set)}`." if args.set else ""
    text = [
        "# End-to-end QA with seeds: a reader per retriever on the SQuAD benchmark (shipped data, 2 CPU cores)\n",
        f"Command: `{command_line(__file__, [a for a in args.argv if a != '--report-only'])}` (resumes where it stopped; "
        "`--report-only` rewrites this file from the records)\n",
        recorded_machine_line(record_dir(args, *pair) / "results.json" for pair in done) + "\n",
        f"Rows: the reader rows of `configs/table/{PRESET}.yaml` (its `reader_training`: a reading-comprehension stage shared by every "
        f"row and seed, then the open-domain stage on each retriever's top passages at the row's seed), seeds {', '.join(map(str, seeds))}; "
        f"{len(done)} (row, seed) pairs. EM@k: the reader's answer from the best of its retriever's first k passages; top-k: that "
        f"retriever's accuracy on the same questions.{settings}\n",
        body.replace("\n## ", "\n### ").replace("# Readers by retriever", "## Readers by retriever", 1),
        "## Stage times (s, built in these pairs; a stage found in the store counts where it was built)\n\n"
        "| stage | row | CPU | median | pairs |\n|---|---|---|---|---|\n"
        + "".join(f"| {stage} | {row} | {cpu} | {statistics.median(v):.0f} | {len(v)} |\n"
                  for stage, by_row in times.items() for (row, cpu), v in by_row.items()),
    ]
    out = "\n".join(text)
    args.results.parent.mkdir(parents=True, exist_ok=True)
    write_keeping_section(args.results, out, KEPT_HEADING)
    return out


def main(argv=None) -> str:
    args = parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else list(argv)
    setup_logging()
    if not args.report_only:
        todo = [(row, seed) for seed in args.seeds for row in args.rows if not finished(args, row, seed)]
        log.info("%d (row, seed) pairs to run", len(todo))
        for row, seed in todo:
            log.info("=== %s, seed %d ===", ROWS[row], seed)
            run_pair(args, row, seed)
    text = write_results(args)
    print(text)
    return text


if __name__ == "__main__":
    main()
