"""benchmarks/reader/run.py in its smoke size (issue 48): the squad_cpu reader rows on BM25 and dpr at
two seeds, a tiny model, a few steps; the records per (row, seed), results.md with mean ± std over
seeds and the seed-aware test against the reader on BM25; a second run builds nothing, and
`--report-only` leaves results.md byte-identical."""

import json

import pytest
from conftest import ROOT, load_script
from test_experiment import squad4  # noqa: F401 - a fixture


@pytest.mark.slow
def test_smoke_reader_study_records_each_pair_and_reports_seed_aware_tests(squad4, tiny_pretrained, tmp_path, monkeypatch):  # noqa: F811
    tiny = [f"table.model.pretrained={tiny_pretrained}", "++table.model.max_length=64", "++table.model.max_question_length=32",
            "table.train.max_steps=2", "table.train.batch_size=2", "table.data.train_articles=3", "table.data.limit_questions=20",
            f"table.reader_training.pretrained={tiny_pretrained}", "table.reader_training.max_length=64", "table.reader_training.max_question_length=24",
            "table.reader_training.retrieve_k=5", "table.reader_training.limit_train_questions=12", "table.reader_training.reading.max_steps=2",
            "table.reader_training.reading.batch_size=4", "table.reader_training.reading.warmup_steps=0", "table.reader_training.open_domain.max_steps=2",
            "table.reader_training.open_domain.batch_size=2", "table.reader_training.open_domain.passages=2", "table.reader_training.open_domain.top_n=5",
            "table.reader_training.open_domain.warmup_steps=0", "table.read.ks=[1,5]", "table.evaluate.batch_size=32"]
    script = load_script(ROOT / "benchmarks" / "reader" / "run.py", "reader_run")
    argv = ["--rows", "reader-bm25", "reader-dpr", "--seeds", "1", "2", "--precision", "fp32", "--bm25-backend", "bm25s", "--squad", str(squad4),
            "--resamples", "99", "--work", str(tmp_path / "work"), "--records", str(tmp_path / "records"),
            "--results", str(tmp_path / "out" / "results.md"), "--set", *tiny]
    text = script.main(argv)
    records = tmp_path / "records"
    assert sorted(p.relative_to(records).as_posix() for p in records.glob("*/*/*")) == sorted(
        f"{row}/seed-{seed}/{name}" for row in ("reader-bm25", "reader-dpr") for seed in (1, 2)
        for name in ("per_query.jsonl", "predictions.json", "results.json", "times.json"))
    results = json.loads((records / "reader-dpr" / "seed-2" / "results.json").read_text())
    assert (results["task"], results["name"], results["seed"]) == ("reader", "reader on dpr", 2)
    times = json.loads((records / "reader-bm25" / "seed-1" / "times.json").read_text())
    assert "reader: reading comprehension" in times and "train reader on BM25" in times  # the first pair builds the shared stage
    assert "reader: reading comprehension" not in json.loads((records / "reader-dpr" / "seed-1" / "times.json").read_text())
    line = next(row for row in text.splitlines() if row.startswith("| reader on dpr |"))
    assert " ± " in line and "| 2 |" in line
    assert "SQuAD EM@1" in text and "SQuAD F1@1" in text and "### Paired differences against reader on BM25" in text and "recipe p" in text
    assert "### Against reader on BM25, seed by seed" in text and "Command: `python benchmarks/reader/run.py --rows" in text
    assert f"| train reader on dpr | reader on dpr | {results['hardware']['cpu']} |" in text  # each time beside the CPU it ran on

    results_md = tmp_path / "out" / "results.md"
    results_md.write_text(results_md.read_text() + "\n## What the figures mean\n\nwritten by hand\n")
    before = results_md.read_bytes()

    def refuse(*a, **k):
        raise AssertionError("a finished (row, seed) pair ran again")

    monkeypatch.setattr(script, "run_pair", refuse)
    script.main(argv)  # every pair recorded: nothing runs
    assert results_md.read_bytes() == before
    script.main([*argv, "--report-only"])
    assert results_md.read_bytes() == before  # the report names the command without --report-only: the same file
