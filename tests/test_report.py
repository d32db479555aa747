"""The report on synthetic results.json files: the paper-style table (systems x datasets, with
parameter counts), EntityQuestions by relation, one PNG of top-k curves per dataset, the
search for results files, and clear errors; then scripts/report.py end to end."""

import json
import subprocess
import sys

import pytest
from conftest import ROOT

from taser.data.errors import DataFormatError
from taser.evaluation.report import find_results, markdown_table, read_run, read_runs, system_name, write_report

PNG = b"\x89PNG\r\n\x1a\n"


def curve(top1, top100):
    return [round(top1 + (top100 - top1) * (k - 1) / 99, 2) for k in range(1, 101)]


def qa(model_type, model, params, top20, top100, dataset="nq-test"):
    return {"task": "qa", "dataset": dataset, "retriever": "dense", "model": model, "model_type": model_type, "parameters": params,
            "questions": 3610, "top_k": {"1": 40.0, "5": 60.0, "20": top20, "100": top100}, "top_k_curve": curve(40.0, top100)}


def write(path, results):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results))
    return path


@pytest.fixture
def runs_dir(tmp_path):
    root = tmp_path / "eval"
    write(root / "nq" / "dpr" / "results.json", qa("dpr", "ckpt/dpr/final", 218_964_480, 78.4, 85.4))
    write(root / "nq" / "taser" / "results.json", qa("taser", "ckpt/taser/final", 128_378_112, 83.6, 89.0))
    bm25 = {"retriever": "bm25", "bm25": {"backend": "pyserini", "k1": 0.9, "b": 0.4}}
    write(root / "nq" / "bm25" / "results.json", {**qa("?", None, None, 59.1, 73.7), **bm25, "parameters": None})
    beir = {"task": "beir", "dataset": "scifact", "retriever": "dense", "model_type": "taser", "model": "ckpt/taser/final", "parameters": 128_378_112,
            "metrics": {"nDCG@10": 0.6712, "Recall@100": 0.9, "MRR@10": 0.63}, "top_k_curve": curve(50.0, 95.0)}
    write(root / "scifact" / "taser" / "results.json", beir)
    eq = {"task": "entity_questions", "dataset": "EntityQuestions", "retriever": "dense", "model_type": "dpr", "model": "ckpt/dpr/final",
          "parameters": 218_964_480, "relations": {"P17": {"questions": 4, "top_k": {"20": 60.0, "100": 80.0}},
                                                  "P20": {"questions": 2, "top_k": {"20": 40.0, "100": 70.0}}},
          "top_k": {"20": 50.0, "100": 75.0}, "top_k_curve": curve(20.0, 75.0)}
    write(root / "eq" / "dpr" / "results.json", eq)
    write(root / "eq" / "dpr" / "relations" / "P17" / "results.json", qa("dpr", "x", 1, 1.0, 2.0))  # inside a run: not a run
    return root


def test_system_names():
    assert system_name({"name": "TASER (ours)"}) == "TASER (ours)"
    assert system_name({"retriever": "bm25", "bm25": {"backend": "pyserini", "k1": 0.9, "b": 0.4}}) == "BM25 (Lucene, k1=0.9, b=0.4)"
    assert system_name({"retriever": "dense", "model_type": "dpr", "model": "/x/outputs/train/dpr/final"}) == "dpr (dpr/final)"
    hybrid = {"retriever": "hybrid", "model_type": "dpr", "model": "a/b", "lambda": 1.1, "bm25": {"backend": "bm25s"}}
    assert system_name(hybrid) == "hybrid: BM25 + dpr (a/b), λ=1.1"


def test_table_and_plots(runs_dir, tmp_path):
    files = find_results([runs_dir])
    assert len(files) == 5 and not any("relations" in str(f) for f in files)
    runs = read_runs([runs_dir])
    report = write_report(runs, tmp_path / "report", ks=(20, 100), beir_metrics=("nDCG@10", "Recall@100"))
    text = (tmp_path / "report" / "report.md").read_text()
    assert text == report["markdown"]
    lines = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]] for line in text.splitlines() if line.startswith("| ")}
    head = lines["system"]
    assert head == ["EntityQuestions top-20", "EntityQuestions top-100", "nq-test top-20", "nq-test top-100",
                    "scifact nDCG@10", "scifact Recall@100", "parameters"]
    assert lines["dpr (dpr/final)"] == ["50.0", "75.0", "78.4", "85.4", "–", "–", "219.0M"]
    assert lines["taser (taser/final)"] == ["–", "–", "83.6", "89.0", "0.671", "0.900", "128.4M"]  # one row for both datasets
    assert lines["BM25 (Lucene, k1=0.9, b=0.4)"] == ["–", "–", "59.1", "73.7", "–", "–", "–"]
    assert lines["P17"] == ["60.0", "80.0"] and lines["**macro average**"] == ["50.0", "75.0"]
    assert set(report["plots"]) == {"nq-test", "scifact", "EntityQuestions"}
    for dataset, path in report["plots"].items():
        with open(path, "rb") as f:
            assert f.read(8) == PNG, dataset
        assert f"]({path.rsplit('/', 1)[1]})" in text  # linked from the markdown, beside it


def test_extra_columns_and_old_results(tmp_path):
    old = write(tmp_path / "old" / "results.json", {"retriever": "bm25", "bm25": {"backend": "bm25s", "k1": 0.9, "b": 0.4},
                                                     "questions": 9, "top_k": {"1": 10.0, "5": 20.0, "20": 30.0, "100": 40.0}})
    run = read_run(old)
    assert (run.task, run.dataset, run.curve) == ("qa", "old", [])  # written before task, dataset and curves
    run.extra = {"train steps": "–"}
    table = markdown_table([run], ks=(1, 5, 20, 100))
    assert table.splitlines()[0] == "| system | old top-1 | old top-5 | old top-20 | old top-100 | parameters | train steps |"
    assert write_report([run], tmp_path / "r")["plots"] == {}  # no curve, no plot


def test_errors(tmp_path, runs_dir):
    with pytest.raises(FileNotFoundError, match="no results file or directory"):
        find_results([tmp_path / "nope"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no results.json under"):
        find_results([tmp_path / "empty"])
    dup = write(tmp_path / "dup" / "results.json", qa("dpr", "ckpt/dpr/final", 1, 1.0, 2.0))
    with pytest.raises(ValueError, match="two runs of 'dpr \\(dpr/final\\)' on 'nq-test'"):
        read_runs([runs_dir, dup])
    for text, message in [("{", "invalid JSON"), ("[]", "expected a JSON object"), ('{"task": "squad"}', "unknown task 'squad'"),
                          ('{"task": "beir", "top_k": {}}', "missing field 'metrics'"),
                          ('{"top_k": {"1": 1}, "top_k_curve": "x"}', "expected a list of numbers")]:
        bad = tmp_path / "bad.json"
        bad.write_text(text)
        with pytest.raises(DataFormatError, match=message):
            read_run(bad)
    with pytest.raises(ValueError, match="unknown BEIR metric"):
        write_report(read_runs([runs_dir]), tmp_path / "out", beir_metrics=("nDCG@20",))
    assert not (tmp_path / "out").exists()  # refused before any plot is written


@pytest.mark.slow
def test_report_script(runs_dir, tmp_path):
    out = tmp_path / "report"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "report.py"), f"runs=[{runs_dir}]", f"out_dir={out}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # no table names its columns: the cut-offs evaluate.py prints, top-1/5/20/100 (EntityQuestions' four empty)
    assert "| taser (taser/final) | – | – | – | – | 40.0 | 60.0 | 83.6 | 89.0 | 0.671 | 128.4M |" in proc.stdout
    assert sorted(p.name for p in out.glob("*.png")) == ["topk-EntityQuestions.png", "topk-nq-test.png", "topk-scifact.png"]


def test_entity_questions_per_relation_averages_each_systems_seeds():
    """Would catch the relations table (EntityQuestions) pooling every system's runs into one, summing
    or multiplying instead of averaging over seeds, or losing what a mean run is (system, dataset, task)."""
    from taser.evaluation.report import relations_table
    from taser.evaluation.runs import RunResult
    from taser.evaluation.table_format import _seed_means

    def eq(system, seed, p17, p36, macro):
        return RunResult(system, "EntityQuestions", "entity_questions", top_k={"20": macro}, seed=seed,
                         relations={"P17": {"20": p17}, **({"P36": {"20": p36}} if p36 is not None else {})})

    runs = [eq("dpr", 1, 60.0, 30.0, 45.0), eq("dpr", 2, 70.0, None, 50.0), eq("taser", 1, 40.0, 20.0, 30.0)]
    means = _seed_means(runs)
    assert [(r.system, r.dataset, r.task) for r in means] == [("dpr", "EntityQuestions", "entity_questions"), ("taser", "EntityQuestions", "entity_questions")]
    assert means[0].top_k == {"20": 47.5} and means[0].relations == {"P17": {"20": 65.0}, "P36": {"20": 30.0}}  # P36: the one seed that has it
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]] for line in relations_table(runs, ks=(20,)).splitlines()}
    assert rows["relation"] == ["dpr top-20", "taser top-20"]
    assert rows["P17"] == ["65.0", "40.0"] and rows["P36"] == ["30.0", "20.0"] and rows["**macro average**"] == ["47.5", "30.0"]


def test_parameter_counts_are_written_in_millions():
    from taser.evaluation.table_format import _fmt_params

    assert [_fmt_params(n) for n in (None, 100_950_000, 66_361_344)] == ["–", "101.0M", "66.4M"]


def test_signed_differences_carry_their_sign_and_their_metrics_decimals():
    from taser.evaluation.table_format import _signed

    assert [_signed(v, "top-20") for v in (-1.26, 0.0, 2.0)] == ["−1.3", "+0.0", "+2.0"]  # the minus sign, not a hyphen
    assert _signed(-0.0123, "nDCG@10") == "−0.012"  # BEIR's fractions: 3 decimals


def test_the_plots_k_axis_is_logarithmic_with_the_papers_cut_offs_as_ticks():
    """k = 1-20, where systems differ, would take a fifth of a linear axis to 100."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from taser.evaluation.curves import k_axis

    fig, ax = plt.subplots()
    try:
        k_axis(ax, 100)
        assert ax.get_xscale() == "log" and ax.get_xlim() == (1.0, 100.0)
        assert list(ax.get_xticks()) == [1, 2, 5, 10, 20, 50, 100]
        assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "2", "5", "10", "20", "50", "100"]
        for k_max, ticks in ((30, [1, 2, 5, 10, 20]), (1000, [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000])):  # a curve to k_max ends there
            ax.clear()
            k_axis(ax, k_max)
            assert list(ax.get_xticks()) == ticks and ax.get_xlim() == (1.0, float(k_max))
    finally:
        plt.close(fig)
