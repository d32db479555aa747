"""benchmarks/ablations/run.py in its smoke size: a tiny model, 2 trained rows x 2 seeds, 2 steps;
results.md carries mean ± std, n and the significance note; a second run skips the finished pairs,
and so does a run on another machine that has only the recorded pairs (what is committed)."""

import importlib.util
import json
import shutil
import sys

from conftest import ROOT, SQUAD


def load_script():
    spec = importlib.util.spec_from_file_location("ablations_run", ROOT / "benchmarks" / "ablations" / "run.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while being defined
    spec.loader.exec_module(module)
    return module


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
