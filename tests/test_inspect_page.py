"""The page to inspect a comparison (`report.py inspect=[...]`): a self-contained HTML file listing
the questions that flipped, sortable and filterable, with both systems' passages and the answers
highlighted. Checked in a real headless browser (Chromium): its DOM after the page's script ran
and its screenshots, with and without a filter. CI installs Chromium (.ci/run); elsewhere the
browser part is skipped when Chromium is missing, saying so."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT

from taser.evaluation.comparison import StatsSettings
from taser.evaluation.inspect_page import inspection_page
from taser.evaluation.inspect_texts import locate, passages_by_id
from taser.evaluation.report import read_runs, write_report

QUESTIONS = [("who wrote hamlet", "Shakespeare"), ("capital of france", "Paris"), ("largest planet", "Jupiter"),
             ("who painted the mona lisa", "Leonardo"), ("boiling point of water in celsius", "100"), ("author of war and peace", "Tolstoy")]


def write_run(root, system, seed, found):
    """A run whose question i is found at rank 1 when found[i], else missed; with its retrieval.json."""
    out = root / system / f"seed-{seed}"
    out.mkdir(parents=True)
    ranks = [1 if f else None for f in found]
    records = []
    for (question, answer), hit in zip(QUESTIONS, found):
        ctxs = [{"id": f"{system}-{seed}-{j}", "title": f"Page {j}", "text": f"This passage mentions {answer} plainly." if hit and j == 0
                 else f"An unrelated passage number {j}.", "score": 1.0 - j / 10, "has_answer": bool(hit and j == 0)} for j in range(3)]
        records.append({"question": question, "answers": [answer], "ctxs": ctxs})
    (out / "retrieval.json").write_text(json.dumps(records))
    top = 100 * float(np.mean(found))
    (out / "results.json").write_text(json.dumps({"task": "qa", "dataset": "Tiny", "name": system, "seed": seed, "top_k": {"1": top, "20": top},
                                                  "top_k_curve": [top] * 20, "per_query_file": "per_query.jsonl"}))
    (out / "per_query.jsonl").write_text("".join(json.dumps({"id": str(i), "rank": r}) + "\n" for i, r in enumerate(ranks)))


@pytest.fixture
def page(tmp_path):
    root = tmp_path / "runs"
    # taser finds q1 and q3 that dpr misses at both seeds (gained), dpr finds q0 taser misses (lost), q4 differs at one seed (mixed)
    write_run(root, "dpr", 1, [1, 0, 1, 0, 0, 1])
    write_run(root, "dpr", 2, [1, 0, 1, 0, 1, 1])
    write_run(root, "taser", 1, [0, 1, 1, 1, 0, 1])
    write_run(root, "taser", 2, [0, 1, 1, 1, 0, 1])
    report = write_report(read_runs([root]), tmp_path / "report", ks=(1, 20), stats=StatsSettings(baseline="dpr", resamples=200),
                          inspect=["taser"], inspect_k=20)
    [path] = report["pages"]
    return tmp_path, path, report


def test_the_page_lists_the_questions_that_flipped(page):
    _, path, report = page
    text = open(path, encoding="utf-8").read()
    assert "<script src" not in text and "<link" not in text and "http" not in text.split("<body>")[1]  # self-contained
    assert text.count("<tr class=row") == 4  # q0 lost, q1 and q3 gained, q4 mixed; q2 and q5 are found by both
    assert 'data-kind=gained data-text="capital of france"' in text and 'data-kind=lost data-text="who wrote hamlet"' in text
    assert "data-kind=mixed" in text and "<mark>Paris</mark>" in text and "<mark>Shakespeare</mark>" in text
    assert "taser against dpr on Tiny, top-20" in text and "the recipe (paired by seed, seeds 1, 2)" in text
    assert "inspect-taser-vs-dpr-tiny-top20.html" in report["markdown"]


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def _browser(args: list[str], cwd) -> subprocess.CompletedProcess:
    browser = _chromium()
    if browser is None:
        if os.environ.get("CI"):
            pytest.fail("Chromium is missing in CI: .ci/run installs it")
        pytest.skip("Chromium is not installed here (apt-get install chromium); CI installs it and runs this test")
    return subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars",
                           "--virtual-time-budget=2000", *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_the_page_in_a_real_browser_filters_its_rows(page):
    """Would catch a page whose script fails in a browser (no rows shown, a filter that changes nothing),
    which parsing the HTML alone does not see."""
    from PIL import Image

    tmp, path, _ = page
    url = f"file://{path}"

    def visible_rows(fragment: str) -> tuple[list[str], str]:
        dom = _browser(["--dump-dom", url + fragment], tmp).stdout
        rows = [chunk for chunk in dom.split("<tr class=\"row\"")[1:]]
        shown = [r.split("data-text=\"")[1].split("\"")[0] for r in rows if "display: none" not in r.split(">")[0]]
        return shown, dom.split('id="shown">')[1].split("<")[0]

    everything, count = visible_rows("")
    assert count == "4" and sorted(everything) == ["boiling point of water in celsius", "capital of france", "who painted the mona lisa",
                                                   "who wrote hamlet"]
    gained, count = visible_rows("#kind=gained")
    assert count == "2" and sorted(gained) == ["capital of france", "who painted the mona lisa"]
    worded, count = visible_rows("#q=hamlet")
    assert count == "1" and worded == ["who wrote hamlet"]
    shots = []
    for name, fragment in (("all.png", ""), ("gained.png", "#kind=gained")):
        done = _browser([f"--screenshot={tmp / name}", "--window-size=1200,900", url + fragment], tmp)
        assert (tmp / name).is_file(), done.stderr[-2000:]
        shots.append(np.asarray(Image.open(tmp / name).convert("L"), dtype=float))
    assert shots[0].std() > 10  # a page was drawn, not a blank
    assert np.abs(shots[0] - shots[1]).mean() > 0.5  # the filter changed what the page shows


# -- the committed ablation runs: texts from the data they were evaluated on ---------------------------------------------
# Their results.json name no data file; the table preset that evaluates their dataset (configs/table/squad_cpu.yaml: SQuAD)
# does: the shipped SQuAD JSON, split after 30 articles. Question 42 of the dev split flips at top-5 between dpr and taser T=2.

ABLATIONS = Path(__file__).resolve().parents[1] / "benchmarks" / "ablations" / "runs"
SHIPPED = Path(__file__).resolve().parents[1] / "data" / "squad" / "squad-v1.1-dev-40-articles.json"
ASER = "What is the purpose of the ASER?"  # question 42 of the dev split
ASER_ANSWER = "evaluates learning levels in rural India"
ASER_PASSAGE = "The Annual Status of Education Report (ASER), which"  # the passage it was written from, article "Private school"


def ablation_runs(root: Path = ABLATIONS):
    return read_runs([root / row / f"seed-{seed}" for row in ("dpr", "taser-t2") for seed in (1, 2)])


QUICK = StatsSettings(baseline="dpr", resamples=200, bootstrap=False)


@pytest.fixture(scope="module")
def ablation_page(tmp_path_factory):
    out = tmp_path_factory.mktemp("ablations")
    report = write_report(ablation_runs(), out, ks=(1, 5, 20, 100), stats=QUICK, inspect=["taser T=2"], inspect_k=5)
    [path] = report["pages"]
    return Path(path), report


def test_the_page_over_committed_ablation_runs_shows_questions_answers_and_passages(ablation_page):
    path, _ = ablation_page
    text = path.read_text(encoding="utf-8")
    for real in (ASER, ASER_ANSWER, ASER_PASSAGE):
        assert real in SHIPPED.read_text(encoding="utf-8")  # real strings of the shipped data
    assert f"<summary>{ASER}</summary>" in text and f"<mark>{ASER_ANSWER}</mark>" in text and ASER_PASSAGE in text
    assert "<b>Private school</b>" in text  # the passage's title
    assert "taser T=2: 3 (seed 1), 4 (seed 2); dpr: 2 (seed 1), 8 (seed 2)" in text  # each seed's first answer, from per_query.jsonl
    rows = text.count("<tr class=row")
    assert rows > 20 and text.count("<div class=gold>") > rows // 2
    assert "<summary>question " not in text and "Answers:</b> –" not in text and "class=warning" not in text
    # where the texts came from: the first preset evaluating SQuAD on the shipped file (several do, on the same data)
    import re

    import yaml

    preset = re.search(r"configs/table/(\w+)\.yaml", text).group(1)
    assert yaml.safe_load((ROOT / "configs" / "table" / f"{preset}.yaml").read_text())["table"]["data"]["squad_json"] == \
        "data/squad/squad-v1.1-dev-40-articles.json"
    assert "data/squad/squad-v1.1-dev-40-articles.json" in text


def test_the_page_names_its_family_and_agrees_with_the_report(ablation_page):
    path, report = ablation_page
    text = path.read_text(encoding="utf-8")
    cell = report["comparison"].cells[("taser T=2", "SQuAD", "top-5")]
    assert "It is the family of report.md beside this page" in text
    assert "4 for the test of these runs (1 system(s) × top-1, top-5, top-20, top-100 on SQuAD) and 4 for the recipe test" in text
    row = next(line for line in report["markdown"].splitlines() if line.startswith("| taser T=2 |") and "recipe p=" in line)
    top5 = row.split(" | ")[2]  # the top-5 column of the differences table
    assert f"recipe p={cell.recipe_holm:.2g}; runs p={cell.p_holm:.2g}" in top5
    assert f"Holm {cell.p_holm:.2g}" in text and f"Holm {cell.recipe_holm:.2g}" in text


def test_a_page_outside_the_reports_columns_says_its_family_differs(tmp_path):
    root = tmp_path / "runs"
    write_run(root, "dpr", 1, [1, 0, 1, 0, 0, 1])
    write_run(root, "dpr", 2, [1, 0, 1, 0, 1, 1])
    write_run(root, "taser", 1, [0, 1, 1, 1, 0, 1])
    write_run(root, "taser", 2, [0, 1, 1, 1, 0, 1])
    report = write_report(read_runs([root]), tmp_path / "report", ks=(20,), stats=StatsSettings(baseline="dpr", resamples=50, bootstrap=False),
                          inspect=["taser"], inspect_k=1)
    text = Path(report["pages"][0]).read_text(encoding="utf-8")
    assert "<b>It is not report.md's family</b>: top-1 is not a column of report.md beside this page (top-20)" in text
    assert "2 comparisons here, 1 in report.md" in text and "add 1 to the report's ks=[...]" in text


def test_a_mistyped_name_fails_before_any_statistics(monkeypatch):
    import taser.evaluation.comparison as comparison
    import taser.evaluation.report as report

    def no_statistics(*args, **kwargs):
        raise AssertionError("statistics computed before the names were checked")

    monkeypatch.setattr(report, "_table_stats", no_statistics)
    monkeypatch.setattr(comparison, "compare", no_statistics)
    runs = ablation_runs()
    with pytest.raises(ValueError, match=r"inspect='taser-t2' is none of the systems \(did you mean 'taser T=2'\?\): 'dpr', 'taser T=2'"):
        write_report(runs, "unused", stats=QUICK, inspect=["taser-t2"])
    with pytest.raises(ValueError, match="needs baseline="):
        write_report(runs, "unused", inspect=["taser T=2"])
    with pytest.raises(ValueError, match="is the baseline"):
        write_report(runs, "unused", stats=QUICK, inspect=["dpr"])


def copied_runs(tmp_path, extra: dict) -> list:
    """The two ablation rows copied away from the repository, their results.json with `extra` fields."""
    for row in ("dpr", "taser-t2"):
        for seed in (1, 2):
            target = tmp_path / "runs" / row / f"seed-{seed}"
            shutil.copytree(ABLATIONS / row / f"seed-{seed}", target)
            results = json.loads((target / "results.json").read_text())
            (target / "results.json").write_text(json.dumps({**results, **extra}))
    return ablation_runs(tmp_path / "runs")


def test_missing_data_warns_once_on_the_page_and_in_the_log(tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    runs = copied_runs(tmp_path, {"qa_file": "outputs/data/squad/dev.qa.tsv", "passages": "outputs/data/squad/passages.tsv"})
    with caplog.at_level("WARNING"):
        report = write_report(runs, tmp_path / "report", ks=(5,), stats=QUICK, inspect=["taser T=2"], inspect_k=5)
    text = Path(report["pages"][0]).read_text(encoding="utf-8")
    assert text.count("class=warning") == 1 and text.index("class=warning") < text.index("<table class=summary>")  # at the top
    warning = text.split("class=warning")[1].split("</div>")[0]
    assert "outputs/data/squad/dev.qa.tsv (named by results.json of the run) is missing: tried " in warning
    assert f"{tmp_path / 'outputs' / 'data' / 'squad' / 'dev.qa.tsv'}" in warning  # which paths were tried
    assert "taser-prepare-squad out_dir=outputs/data/squad" in warning  # how to get it back
    logged = [r.getMessage() for r in caplog.records if "texts missing" in r.getMessage()]
    assert len(logged) == 1 and "taser-prepare-squad out_dir=outputs/data/squad" in logged[0]
    assert "<summary>question 42</summary>" in text  # the rows still list the questions, by id


def test_runs_naming_no_data_warn_and_say_how_to_get_texts(tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    runs = copied_runs(tmp_path, {"dataset": "SQuAD-elsewhere"})
    with caplog.at_level("WARNING"):
        page = inspection_page([r for r in runs if r.system == "taser T=2"], [r for r in runs if r.system == "dpr"], 5)
    assert page.count("class=warning") == 1 and "no table preset (configs/table/*.yaml) evaluates a dataset named SQuAD-elsewhere" in page
    assert "keeps retrieval.json" in page
    assert sum("texts missing" in r.getMessage() for r in caplog.records) == 1


def test_a_recorded_path_of_another_machine_is_found_in_this_checkout(tmp_path):
    """A run that names its data by an absolute path elsewhere (where it ran) reads the same file under this repository."""
    runs = copied_runs(tmp_path, {"squad_json": "/elsewhere/checkout/data/squad/squad-v1.1-dev-40-articles.json", "train_articles": 30})
    page = inspection_page([r for r in runs if r.system == "taser T=2"], [r for r in runs if r.system == "dpr"], 5)
    assert f"<summary>{ASER}</summary>" in page and ASER_PASSAGE in page and "class=warning" not in page
    assert "named by results.json of the run" in page
    found, tried = locate("/elsewhere/checkout/data/squad/squad-v1.1-dev-40-articles.json")
    assert found == SHIPPED.resolve() and Path("/elsewhere/checkout/data/squad/squad-v1.1-dev-40-articles.json") in tried


def test_passages_recorded_by_id_are_read_in_one_pass_of_the_passages_file(tmp_path):
    """retrieval.json ctxs without texts take them from the passages TSV the run names; only the ids shown are read, and
    the pass stops once they are found (a broken row after them is never reached)."""
    root = tmp_path / "runs"
    write_run(root, "dpr", 1, [1, 0, 1, 0, 0, 1])
    write_run(root, "taser", 1, [0, 1, 1, 1, 0, 1])
    for system in ("dpr", "taser"):
        run = root / system / "seed-1"
        records = json.loads((run / "retrieval.json").read_text())
        for record in records:
            record["ctxs"] = [{"id": c["id"], "has_answer": c["has_answer"]} for c in record["ctxs"]]
        (run / "retrieval.json").write_text(json.dumps(records))
        results = json.loads((run / "results.json").read_text())
        (run / "results.json").write_text(json.dumps({**results, "passages": "passages.tsv"}))  # beside the runs, found from the run's parents
    rows = [f"{s}-1-{j}\tText of passage {s} {j}, with Paris.\tTitle {s} {j}" for s in ("dpr", "taser") for j in range(3)]
    (root / "passages.tsv").write_text("id\ttext\ttitle\n" + "\n".join(rows) + "\nbroken\t\tno text\n")
    runs = read_runs([root])
    page = inspection_page([r for r in runs if r.system == "taser"], [r for r in runs if r.system == "dpr"], 20)
    assert "Title taser 0</b> Text of passage taser 0, with <mark>Paris</mark>." in page and "class=warning" not in page
    with pytest.raises(Exception, match="empty text"):  # an id that is not there: the pass reads to the end, and the broken row
        passages_by_id(root / "passages.tsv", ["nowhere"])
    assert set(passages_by_id(root / "passages.tsv", ["dpr-1-2", "taser-1-0"])) == {"dpr-1-2", "taser-1-0"}


def test_the_ablation_page_in_a_real_browser_shows_its_texts(ablation_page, tmp_path):
    path, _ = ablation_page
    dom = _browser(["--dump-dom", f"file://{path}#q=aser"], tmp_path).stdout
    rows = [r for r in dom.split('<tr class="row"')[1:] if "display: none" not in r.split(">")[0]]
    assert dom.split('id="shown">')[1].split("<")[0] == str(len(rows)) and len(rows) >= 1
    assert ASER in rows[0] and f"<mark>{ASER_ANSWER}</mark>" in rows[0] and ASER_PASSAGE in rows[0]
