"""Long stages show progress with an ETA (`taser.progress`): a tqdm bar on a terminal, log lines at
an interval elsewhere; and FAISS's loader messages are one line naming the instruction set."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
from tqdm import tqdm

from taser import progress as progress_module
from taser.data.passages import Passage, read_passages, write_passages
from taser.progress import LoggingBar, progress

ROOT = Path(__file__).resolve().parents[1]
SQUAD = ROOT / "data" / "squad" / "squad-v1.1-dev-40-articles.json"


def lines(caplog, desc: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "taser.progress" and r.getMessage().startswith(desc)]


def test_off_a_terminal_progress_is_logged_with_an_eta_at_an_interval(caplog, monkeypatch):
    caplog.set_level(logging.INFO, logger="taser.progress")
    clock = [1000.0]
    monkeypatch.setattr("tqdm.std.time", lambda: clock[0])  # tqdm's clock
    bar = progress(total=100, desc="encode passages", unit="passage", every=30)
    assert isinstance(bar, LoggingBar)
    for _ in range(10):
        clock[0] += 10  # 10 s per 10 passages: a line every third update at most
        bar.update(10)
    bar.close()
    logged = lines(caplog, "encode passages")
    assert logged[0] == "encode passages: 0/100 (0%) [00:00<?, ?passage/s]"  # the start
    assert logged[-1].startswith("encode passages: 100/100 (100%) [01:40<00:00, ")  # the end
    assert 3 <= len(logged) - 2 <= 4  # every 30 s of 100 s, not every update
    middle = " ".join(logged[1].split())  # tqdm pads the rate to 5 characters
    assert middle.startswith("encode passages: 30/100 (30%) [00:30<01:10, 1.00passage/s]"), middle  # count, elapsed, ETA, rate

    caplog.clear()
    for _ in progress(iter(range(5)), desc="no total"):
        pass
    assert lines(caplog, "no total")[-1].startswith("no total: 5 [")  # a count and a rate when the total is unknown

    caplog.clear()
    quiet = progress(total=5, desc="quiet", enabled=False)
    quiet.update(5)
    quiet.close()
    assert not lines(caplog, "quiet")


def test_on_a_terminal_progress_is_tqdms_bar(monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="taser.progress")
    monkeypatch.setattr(progress_module, "on_terminal", lambda stream=None: True)
    with progress(total=3, desc="bar") as bar:
        assert type(bar) is tqdm and not bar.disable
        bar.update(3)
    assert not lines(caplog, "bar")


def test_reading_passages_shows_the_bytes_read(tmp_path, caplog, monkeypatch):
    caplog.set_level(logging.INFO, logger="taser.progress")
    monkeypatch.setattr("taser.data.passages.PROGRESS_ROWS", 7)
    passages = [Passage(str(i), f"passage number {i} " * 20, f"Title {i}") for i in range(50)]
    write_passages(tmp_path / "p.tsv", passages)
    assert list(read_passages(tmp_path / "p.tsv", progress=True)) == passages == list(read_passages(tmp_path / "p.tsv"))
    logged = lines(caplog, "read passages")
    assert len(logged) >= 2 and "(100%)" in logged[-1] and "B/s]" in logged[-1]  # the bytes read, of the file's size


@pytest.fixture(scope="module")
def squad_corpus(tmp_path_factory):
    articles = json.loads(SQUAD.read_text(encoding="utf-8"))["data"][:3]
    passages, questions = [], []
    for article in articles:
        for j, paragraph in enumerate(article["paragraphs"]):
            passages.append(Passage(f"{article['title']}-{j}", paragraph["context"], article["title"].replace("_", " ")))
            questions += [qa["question"] for qa in paragraph["qas"][:1]]
    tsv = tmp_path_factory.mktemp("corpus") / "passages.tsv"
    write_passages(tsv, passages)
    return tsv, questions


def test_bm25_indexing_and_search_show_progress(squad_corpus, tmp_path, caplog, monkeypatch):
    from taser.retrieval import bm25

    caplog.set_level(logging.INFO, logger="taser.progress")
    tsv, questions = squad_corpus
    index = bm25.BM25Index.build(tsv, tmp_path / "index", backend="bm25s")
    assert "(100%)" in lines(caplog, "BM25 (bm25s): read passages")[-1]
    whole = index.batch_search(questions, k=5)  # fewer than a block: one search, no bar
    assert not lines(caplog, "BM25 (bm25s): search")
    monkeypatch.setattr(bm25, "SEARCH_BLOCK", 7)
    assert index.batch_search(questions, k=5) == whole  # block by block: the same results
    assert lines(caplog, "BM25 (bm25s): search")[-1].startswith(f"BM25 (bm25s): search: {len(questions)}/{len(questions)} (100%)")
    caplog.clear()
    assert index.batch_search(questions, k=5, progress=False) == whole
    assert not lines(caplog, "BM25 (bm25s): search")


def test_mining_a_qa_file_knows_its_total(tmp_path, caplog):
    from taser.retrieval.mining import mine_hard_negatives

    caplog.set_level(logging.INFO, logger="taser.progress")
    qa = tmp_path / "q.qa.tsv"
    qa.write_text("".join(f"question {i}?\t['answer']\n" for i in range(12)) + "\n")

    class Store:
        def get_many(self, pids):
            return {}

    mine_hard_negatives(qa, tmp_path / "out.json", lambda questions, k: [[] for _ in questions], Store(), block_size=5)
    assert lines(caplog, "mine negatives")[0] == "mine negatives: 0/12 (0%) [00:00<?, ?question/s]"
    assert lines(caplog, "mine negatives")[-1].startswith("mine negatives: 12/12 (100%)")


def test_conversion_shows_its_steps(tiny_pretrained, tokenizer, tmp_path, caplog):
    from conftest import tiny_model_cfg

    from taser.models.loading import load_model
    from taser.pipeline.convert import convert_checkpoint

    caplog.set_level(logging.INFO, logger="taser.progress")
    model, _ = load_model(tiny_model_cfg(tiny_pretrained, "shared"))
    model.save(tmp_path / "shared", tokenizer)
    convert_checkpoint("export_sentence_transformers", tmp_path / "shared", tmp_path / "st")
    logged = lines(caplog, "export_sentence_transformers")
    assert logged[0].startswith("export_sentence_transformers: 0/2 (0%)")
    assert logged[-1].startswith("export_sentence_transformers: 2/2 (100%)") and logged[-1].endswith(f"write {tmp_path / 'st'} done]")


def test_faiss_loader_messages_become_one_line():
    """faiss-cpu's dynamic-dispatch build makes its loader log a failed AVX2 import at every run;
    importing it through this package logs one line naming the instruction set instead."""
    code = "import logging; logging.basicConfig(level=logging.INFO); import taser.retrieval.faiss_index; import faiss; print(faiss.get_compile_options())"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "faiss.loader" not in proc.stderr and "Could not load library" not in proc.stderr
    said = [line for line in proc.stderr.splitlines() if "taser.retrieval.faiss" in line]
    assert len(said) == 1, proc.stderr
    options = proc.stdout.strip()
    level = next((w for w in options.split() if w in ("AVX512_SPR", "AVX512", "AVX2", "SVE", "NEON")), "generic")
    assert f"uses {level}" in said[0] and f"(compile options: {options})" in said[0]


def test_a_commands_log_holds_no_model_loading_bars(tiny_pretrained, tmp_path):
    """Off a terminal, transformers' "Loading weights" bar would be a line in the log for every model loaded."""
    script = (f"import sys; from taser.cli import setup_logging; setup_logging(); "
              f"from transformers import AutoModel; AutoModel.from_pretrained({tiny_pretrained!r}); print('loaded')")
    env = {k: v for k, v in __import__("os").environ.items() if k != "HF_HUB_DISABLE_PROGRESS_BARS"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0 and done.stdout.strip() == "loaded", done.stderr[-2000:]
    assert "Loading weights" not in done.stderr and "it/s" not in done.stderr, done.stderr
