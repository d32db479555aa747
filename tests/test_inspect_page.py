"""The page to inspect a comparison (`report.py inspect=[...]`): a self-contained HTML file listing
the questions that flipped, sortable and filterable, with both systems' passages and the answers
highlighted. Checked in a real headless browser (Chromium): its DOM after the page's script ran
and its screenshots, with and without a filter. CI installs Chromium (.ci/run); elsewhere the
browser part is skipped when Chromium is missing, saying so."""

import json
import os
import shutil
import subprocess

import numpy as np
import pytest

from taser.evaluation.comparison import StatsSettings
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
