"""benchmarks/ablations/run.py in its smoke size: a tiny model, 2 trained rows x 2 seeds, 2 steps;
results.md carries mean ± std, n and the significance note; a second run skips the finished pairs,
and so does a run on another machine that has only the recorded pairs (what is committed)."""

import importlib.util
import json
import shutil
import sys

import pytest
from conftest import ROOT, SQUAD


def load_script():
    spec = importlib.util.spec_from_file_location("ablations_run", ROOT / "benchmarks" / "ablations" / "run.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while being defined
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_smoke_study_resumes(tmp_path, tiny_pretrained, monkeypatch):
    squad = tmp_path / "squad-4.json"
    data = json.loads(SQUAD.read_text())
    squad.write_text(json.dumps({"version": "1.1", "data": data["data"][:4]}))
    script = load_script()
    argv = ["--rows", "dpr", "taser-t1", "--seeds", "1", "2", "--steps", "2", "--batch", "2", "--model", tiny_pretrained,
            "--max-length", "64", "--bm25-backend", "bm25s", "--squad", str(squad), "--train-articles", "3", "--limit-questions", "60", "--precision", "fp32",
            "--resamples", "99", "--work", str(tmp_path / "work"), "--results", str(tmp_path / "out" / "results.md"),
            "--records", str(tmp_path / "records")]
    text = script.main(argv)
    runs = tmp_path / "work" / "runs"
    assert sorted(p.relative_to(runs).as_posix() for p in runs.glob("*/*/retrieval/results.json")) == [
        f"{row}/seed-{seed}/retrieval/results.json" for row in ("dpr", "taser-t1") for seed in (1, 2)]
    results = json.loads((runs / "taser-t1" / "seed-2" / "retrieval" / "results.json").read_text())
    assert (results["seed"], results["system"]) == (2, "taser T=1")
    assert (runs / "taser-t1" / "seed-2" / "retrieval" / "per_query.jsonl").is_file()
    stages = json.loads((runs / "taser-t1" / "seed-2" / "experiment.json").read_text())["stages"]
    assert [s["built"] for s in stages if s["stage"] in ("data", "BM25 index", "negatives")] == [False, False, False]  # shared with dpr's pairs
    assert "| system | SQuAD top-1 | SQuAD top-5 | SQuAD top-20 | SQuAD top-100 | seeds | parameters |" in text
    taser_line = next(line for line in text.splitlines() if line.startswith("| taser T=1 |"))
    assert " ± " in taser_line and "| 2 |" in taser_line
    assert "Holm" in text and "2 training seed(s)" in text and "Machine:" in text and "Command: `python benchmarks/ablations/run.py" in text
    assert text.count("## Seed against seed") == 1  # once, not once per baseline
    assert "| taser T=1 | 0 of 1 (largest Δ" in text or "| taser T=1 | 1 of 1 (largest Δ" in text
    assert "### Against dpr, seed by seed" in text
    # a hand-written closing section survives the rewrite, and a second run trains nothing
    results_md = tmp_path / "out" / "results.md"
    results_md.write_text(results_md.read_text() + "\n## What the study supports\n\nwritten by hand\n")

    def refuse(*a, **k):
        raise AssertionError("a finished (row, seed) pair ran again")

    monkeypatch.setattr(script, "run_pair", refuse)
    script.main(argv)
    assert "written by hand" in results_md.read_text() and "| taser T=1 |" in results_md.read_text()
    records = tmp_path / "records"
    assert sorted(p.relative_to(records).as_posix() for p in records.glob("*/*/*")) == sorted(
        f"{row}/seed-{seed}/{name}" for row in ("dpr", "taser-t1") for seed in (1, 2) for name in ("per_query.jsonl", "results.json", "times.json"))
    # another machine: the committed records without the work directory. Finished pairs stay done;
    # the hybrid row, which needs dpr's model, trains that seed's dpr again without touching its record
    monkeypatch.undo()
    shutil.rmtree(tmp_path / "work")
    recorded = (records / "dpr" / "seed-1" / "results.json").read_text()
    ran = []
    run_pair = script.run_pair
    monkeypatch.setattr(script, "run_pair", lambda args, row, seed: ran.append((row.key, seed)) or run_pair(args, row, seed))
    script.main(["--rows", "dpr", "taser-t1", "hybrid", *argv[3:]])
    assert ran == [("hybrid", 1), ("hybrid", 2)]
    assert (records / "dpr" / "seed-1" / "results.json").read_text() == recorded
    assert (records / "hybrid" / "seed-2" / "results.json").is_file()
    stages = json.loads((tmp_path / "work" / "runs" / "hybrid" / "seed-2" / "experiment.json").read_text())["stages"]
    assert [s["built"] for s in stages if s["stage"] == "train dpr"] == [True]  # dpr at seed 2, trained again for the hybrid


# --- the report holds every recorded seed (issue 47): `--report-only` with the default --seeds once
# dropped the seed-4/5 records of results.md; a rewrite that changes figures says so


RECORDS = ROOT / "benchmarks" / "ablations" / "runs"


def fake_records(root, seeds_of):
    """Bare records (a results.json each) of the rows in `seeds_of`: {row key: seeds, or [None]}."""
    for key, seeds in seeds_of.items():
        for seed in seeds:
            directory = root / key / ("no-seed" if seed is None else f"seed-{seed}")
            directory.mkdir(parents=True)
            (directory / "results.json").write_text("{}")
    (root / "dpr" / "seed-7").mkdir()  # a seed directory without results.json: not finished, not reported
    (root / "dpr" / "seed-x").mkdir()


def test_report_pairs_every_recorded_seed(tmp_path):
    script = load_script()
    fake_records(tmp_path, {"zero-shot": [None], "dpr": [1, 2, 3, 4, 5], "taser-t2": [1, 2, 3, 5]})
    held = lambda argv: [(row.key, seed) for row, seed in script.report_pairs(script.parse_args([*argv, "--records", str(tmp_path)]))]  # noqa: E731
    every = [("zero-shot", None)] + [("dpr", s) for s in (1, 2, 3, 4, 5)] + [("taser-t2", s) for s in (1, 2, 3, 5)]
    assert held(["--report-only"]) == every  # not the default seeds 1 2 3
    assert held([]) == every  # the report at the end of a training run too
    assert held(["--seeds", "1", "2"]) == every  # --seeds of a training run: what to run, not what to report
    assert held(["--report-only", "--seeds", "2", "5"]) == [("zero-shot", None), ("dpr", 2), ("dpr", 5), ("taser-t2", 2), ("taser-t2", 5)]
    assert script.parse_args([]).seeds == [1, 2, 3]  # what a training run runs by default is unchanged


def test_report_command_names_the_seeds_held():
    script = load_script()

    def command(argv, held):
        args = script.parse_args(argv)
        args.argv = argv
        return script.report_command(args, held)

    assert command(["--report-only"], [1, 2, 3, 4, 5]) == "python benchmarks/ablations/run.py --seeds 1 2 3 4 5"
    assert command(["--report-only"], [1, 2]) == "python benchmarks/ablations/run.py"  # a stopped default study: resumes it
    assert command(["--rows", "dpr", "--seeds", "4", "5"], [1, 2, 3, 4, 5]) == "python benchmarks/ablations/run.py --rows dpr --seeds 1 2 3 4 5"
    assert command(["--seed", "1", "2", "--report", "--steps", "2"], [1, 2]) == "python benchmarks/ablations/run.py --seeds 1 2 --steps 2"


def test_report_changes_say_which_figures_moved(tmp_path, capsys):
    script = load_script()
    script.setup_logging()
    old = "# t\n\n| dpr | 55.5 ± 1.3 | 5 |\n| taser | 55.9 | 5 |\n"
    assert script.warn_changes(tmp_path / "r.md", old, old) == []
    assert "differs" not in capsys.readouterr().err
    new = old.replace("55.5 ± 1.3 | 5", "55.7 ± 1.1 | 3")
    assert script.warn_changes(tmp_path / "r.md", old, new) == ["@@ -3 +3 @@", "-| dpr | 55.5 ± 1.3 | 5 |", "+| dpr | 55.7 ± 1.1 | 3 |"]
    err = capsys.readouterr().err
    assert "FIGURES CHANGED" in err and "-| dpr | 55.5 ± 1.3 | 5 |" in err and "+| dpr | 55.7 ± 1.1 | 3 |" in err
    script.warn_changes(tmp_path / "r.md", old, old.replace("# t", "# title"))
    assert "no figure changed" in capsys.readouterr().err


def test_report_only_rewrites_from_every_record(tmp_path, capsys):
    """Over records of seeds 1-5 (copies of the committed dpr ones), `--report-only` reports all five,
    a second one leaves the file as it was, and one restricted by --seeds says so and warns."""
    script = load_script()
    records = tmp_path / "runs"
    for key, seeds in {"zero-shot": ["no-seed"], "dpr": [f"seed-{s}" for s in range(1, 6)]}.items():
        for seed in seeds:
            shutil.copytree(RECORDS / key / seed, records / key / seed)
    results = tmp_path / "results.md"
    argv = ["--report-only", "--records", str(records), "--results", str(results), "--resamples", "99"]
    text = script.main(argv)
    dpr_line = next(line for line in text.splitlines() if line.startswith("| dpr |"))
    assert dpr_line.endswith("| 5 | 45.4M |") and "seeds 1, 2, 3, 4, 5." in text and "Rows finished: 6 (row, seed) pairs" in text
    assert "--resamples 99 --seeds 1 2 3 4 5` (resumes" in text  # the seeds it holds, not a default
    results.write_text(results.read_text() + "\n## What the study supports\n\nwritten by hand\n")
    written = results.read_text()
    capsys.readouterr()
    script.main(argv)
    assert results.read_text() == written and "differs from the file it replaced" not in capsys.readouterr().err
    script.main([*argv, "--seeds", "1", "2", "3"])  # restricted: fine, but the file says so and the rewrite is not silent
    now = results.read_text()
    assert "seeds 1, 2, 3 (only those of --seeds; the records also hold seed(s) 4, 5)" in now and "--resamples 99 --seeds 1 2 3` (resumes" in now
    assert next(line for line in now.splitlines() if line.startswith("| dpr |")).endswith("| 3 | 45.4M |")
    assert "written by hand" in now
    err = capsys.readouterr().err
    assert "FIGURES CHANGED" in err and f"-{dpr_line}" in err


def test_time_by_seed_sums_each_seeds_pairs_on_its_machine():
    """The figures the hand-written paragraph about time quotes: per (seed, machine), the pairs, their
    summed hours and the fastest and slowest pair in minutes, seeds in order, seedless rows last."""
    run = load_script()
    table = run.time_by_seed({(2, "X"): [600.0, 1200.0], (1, "X"): [60.0, 3540.0, 1800.0], (None, "X"): [90.0]})
    rows = [line for line in table.splitlines() if line.startswith("| ") and "seed |" not in line]
    assert rows == ["| 1 | X | 3 | 1.50 | 1.0 – 59.0 |", "| 2 | X | 2 | 0.50 | 10.0 – 20.0 |", "| – | X | 1 | 0.03 | 1.5 – 1.5 |"]
