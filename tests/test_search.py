"""Search one's own texts (`taser-search`, `taser.Searcher`): corpora in DPR's TSV, JSONL and BEIR
layouts, queries without answers, checkpoints trained or released (converted once, cached), BM25 and
hybrid; rankings as a TREC run and as JSON lines with texts; bad input as one line, exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import FIXTURES, ROOT, tiny_model_cfg

from taser.data.errors import DataFormatError
from taser.data.queries import read_queries

BEIR = FIXTURES / "beir-tiny"


def trec_lines(path: Path) -> list[list[str]]:
    """The run's lines, checked against TREC's format: 6 fields, ranks 1.. per query, scores not increasing."""
    rows = [line.split() for line in path.read_text().splitlines()]
    by_query: dict[str, list[list[str]]] = {}
    for row in rows:
        assert len(row) == 6 and row[1] == "Q0", row
        by_query.setdefault(row[0], []).append(row)
    for hits in by_query.values():
        assert [int(r[3]) for r in hits] == list(range(1, len(hits) + 1))
        scores = [float(r[4]) for r in hits]
        assert scores == sorted(scores, reverse=True)
        assert len({r[2] for r in hits}) == len(hits)
    return rows


# -- queries -----------------------------------------------------------------------------------
def test_queries_are_read_from_each_layout(tmp_path):
    (tmp_path / "ids.tsv").write_text("a1\twho wrote hamlet\nb2\twhere is paris\n")
    (tmp_path / "dpr.tsv").write_text('who wrote hamlet\t["Shakespeare"]\nwhere is paris\t["France"]\n')
    (tmp_path / "plain.tsv").write_text("who wrote hamlet\n\nwhere is paris\n")
    (tmp_path / "q.jsonl").write_text('{"_id": "a1", "text": "who wrote hamlet"}\n{"qid": 7, "query": "where is paris"}\n')
    assert read_queries(tmp_path / "ids.tsv") == {"a1": "who wrote hamlet", "b2": "where is paris"}
    assert read_queries(tmp_path / "dpr.tsv") == {"q1": "who wrote hamlet", "q2": "where is paris"}
    assert read_queries(tmp_path / "plain.tsv") == {"q1": "who wrote hamlet", "q2": "where is paris"}
    assert read_queries(tmp_path / "q.jsonl") == {"a1": "who wrote hamlet", "7": "where is paris"}
    assert len(read_queries(BEIR / "queries.jsonl")) > 0


@pytest.mark.parametrize("name, text, where, what", [
    ("dup.tsv", "a\tone\na\ttwo\n", "line 2", "duplicate query id 'a'"),
    ("three.tsv", "a\tb\tc\n", "line 1", "3 tab-separated columns"),
    ("space.tsv", "a b\tone\n", "line 1", "holds spaces"),
    ("empty.tsv", "a\t \n", "line 1", "empty query text"),
    ("noid.jsonl", '{"text": "x"}\n', "line 1", "needs a query id"),
    ("notext.jsonl", '{"_id": "x"}\n', "line 1", "needs a query text"),
])
def test_a_bad_queries_file_names_the_file_the_line_and_the_fault(tmp_path, name, text, where, what):
    (tmp_path / name).write_text(text)
    with pytest.raises(DataFormatError) as error:
        read_queries(tmp_path / name)
    assert error.value.where == where and what in error.value.what and str(tmp_path / name) in str(error.value)


def test_a_missing_or_empty_queries_file_says_so(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_queries(tmp_path / "absent.tsv")
    (tmp_path / "blank.tsv").write_text("\n\n")
    with pytest.raises(DataFormatError, match="no query in the file"):
        read_queries(tmp_path / "blank.tsv")


# -- corpora -------------------------------------------------------------------------------------
def test_a_jsonl_corpus_is_converted_once_and_again_only_when_it_changes(tmp_path):
    from taser.data.corpus import passages_tsv
    from taser.data.passages import read_passages

    corpus = tmp_path / "docs.jsonl"
    corpus.write_text('{"id": "d1", "contents": "Paris is in France.", "title": "Paris"}\n{"_id": "d2", "text": "Hamlet is a play."}\n')
    tsv = passages_tsv(corpus, tmp_path / "work")
    assert [(p.id, p.text, p.title) for p in read_passages(tsv)] == [("d1", "Paris is in France.", "Paris"), ("d2", "Hamlet is a play.", "")]
    written = tsv.stat().st_mtime_ns
    assert passages_tsv(corpus, tmp_path / "work") == tsv and tsv.stat().st_mtime_ns == written  # reused
    time.sleep(0.01)
    corpus.write_text('{"id": "d3", "contents": "Rome is in Italy."}\n')
    assert [p.id for p in read_passages(passages_tsv(corpus, tmp_path / "work"))] == ["d3"]
    assert passages_tsv(BEIR, tmp_path / "beir-work").is_file()  # a BEIR directory: its corpus.jsonl
    plain = tmp_path / "plain.tsv"
    plain.write_text("id\ttext\ttitle\n1\tsome text\tT\n")
    assert passages_tsv(plain, tmp_path / "work") == plain  # DPR's TSV: read in place


def test_a_corpus_that_is_not_there_or_not_a_corpus_is_refused(tmp_path):
    from taser.data.corpus import passages_tsv

    with pytest.raises(FileNotFoundError, match="does not exist"):
        passages_tsv(tmp_path / "absent.jsonl", tmp_path / "work")
    with pytest.raises(FileNotFoundError, match="without corpus.jsonl"):
        passages_tsv(tmp_path, tmp_path / "work")
    (tmp_path / "bad.jsonl").write_text('{"id": "d1", "contents": "x"}\n{"id": "d1", "contents": "y"}\n')
    with pytest.raises(DataFormatError, match="line 2: duplicate document id 'd1'"):
        passages_tsv(tmp_path / "bad.jsonl", tmp_path / "work")
    assert not (tmp_path / "work" / "corpus" / "source.json").exists()  # nothing vouches for a half-converted corpus


# -- checkpoints ---------------------------------------------------------------------------------
@pytest.fixture
def released_pair(tmp_path, tokenizer, monkeypatch):
    """A released DPR pair in transformers' layout (tiny random weights), registered under a hub name; the cache in tmp."""
    import torch
    from transformers import DPRConfig, DPRContextEncoder, DPRQuestionEncoder

    from taser.pipeline import released

    config = DPRConfig(vocab_size=tokenizer.vocab_size, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
    for seed, (name, cls) in enumerate((("question", DPRQuestionEncoder), ("ctx", DPRContextEncoder))):
        torch.manual_seed(seed)
        cls(config).eval().save_pretrained(tmp_path / "hub" / name)
        tokenizer.save_pretrained(tmp_path / "hub" / name)
    pair = released.Released("import_hf_dpr", str(tmp_path / "hub" / "question"), str(tmp_path / "hub" / "ctx"))
    monkeypatch.setitem(released.RELEASED, "org/dpr-tiny", pair)
    monkeypatch.setenv("TASER_CACHE", str(tmp_path / "cache"))
    return "org/dpr-tiny"


def test_a_released_model_is_converted_once_then_read_from_the_cache(released_pair, monkeypatch):
    from taser.pipeline import released

    first = released.resolve_checkpoint(released_pair)
    assert (first / "config.json").is_file() and first.parent == Path(released.cache_home()) / "released"
    monkeypatch.setattr(released, "_convert", lambda *a: pytest.fail("converted a second time"))
    assert released.resolve_checkpoint(released_pair) == first


def test_a_released_model_the_hub_cannot_give_names_the_download_command(tmp_path, monkeypatch):
    from taser.pipeline import released

    monkeypatch.setenv("TASER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setitem(released.RELEASED, "org/absent", released.Released("import_hf_dpr", str(tmp_path / "nowhere-q"), str(tmp_path / "nowhere-c")))
    with pytest.raises(released.CheckpointUnavailable) as error:
        released.resolve_checkpoint("org/absent")
    message = str(error.value)
    assert "hf download" in message and "nowhere-q" in message and "\n" not in message
    assert not list((tmp_path / "cache" / "released").glob("*")), "a failed conversion left files in the cache"


def test_a_checkpoint_that_does_not_exist_or_is_not_one_says_which(tmp_path):
    from taser.pipeline.released import CheckpointUnavailable, resolve_checkpoint

    with pytest.raises(CheckpointUnavailable, match="does not exist.*facebook/dpr-question_encoder-single-nq-base"):
        resolve_checkpoint(tmp_path / "absent")
    with pytest.raises(CheckpointUnavailable, match="is not a checkpoint: it holds no config.json"):
        resolve_checkpoint(tmp_path)


def test_a_pickled_release_is_converted_only_when_allowed(tmp_path, monkeypatch):
    from taser.pipeline import released

    monkeypatch.setenv("TASER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(released, "_convert", lambda *a: pytest.fail("fetched and unpickled without allow_pickle"))
    with pytest.raises(released.CheckpointUnavailable, match="allow_pickle=true"):
        released.resolve_checkpoint("kelvinih/taser-bert-base-uncased")


def test_either_encoder_of_a_released_dpr_pair_names_the_one_conversion(tmp_path, monkeypatch):
    from taser.pipeline import released

    monkeypatch.setenv("TASER_CACHE", str(tmp_path / "cache"))
    made = []

    def convert(release, out, allow_pickle):
        made.append(release)
        out.mkdir(parents=True)
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(released, "_convert", convert)
    question = released.resolve_checkpoint("facebook/dpr-question_encoder-single-nq-base")
    assert released.resolve_checkpoint("facebook/dpr-ctx_encoder-single-nq-base") == question and len(made) == 1


# -- searching -----------------------------------------------------------------------------------
@pytest.fixture
def trained(tmp_path, tiny_pretrained):
    from taser.models.loading import load_model

    model, tokenizer = load_model(tiny_model_cfg(tiny_pretrained, "dpr"))
    model.save(tmp_path / "ckpt", tokenizer)
    return tmp_path / "ckpt"


def test_search_with_a_trained_and_a_released_checkpoint_and_bm25_writes_valid_rankings(tmp_path, trained, released_pair):
    from taser import Searcher
    from taser.retrieval.bm25 import BM25Settings

    queries = read_queries(BEIR / "queries.jsonl")
    for name, searcher in [("trained", Searcher(BEIR, trained, work_dir=tmp_path / "work")),
                           ("released", Searcher(BEIR, released_pair, work_dir=tmp_path / "work")),
                           ("bm25", Searcher(BEIR, retriever="bm25", work_dir=tmp_path / "work", bm25=BM25Settings(backend="bm25s"))),
                           ("hybrid", Searcher(BEIR, trained, retriever="hybrid", work_dir=tmp_path / "work", bm25=BM25Settings(backend="bm25s")))]:
        rankings = searcher.search(queries, k=3)
        files = searcher.write(rankings, tmp_path / name, queries)
        rows = trec_lines(files["trec"])
        full = name in ("trained", "released")  # BM25 finds nothing for a query without a corpus term: no TREC line, an empty JSONL list
        assert ({r[0] for r in rows} == set(queries) if full else {r[0] for r in rows} <= set(queries)), name
        assert all(len(hits) == 3 if full else len(hits) <= 3 for hits in rankings.values()), name
        records = [json.loads(line) for line in files["jsonl"].read_text().splitlines()]
        assert [r["query_id"] for r in records] == list(queries) and records[0]["query"] == queries[records[0]["query_id"]]
        hit = records[0]["hits"][0]
        assert hit["rank"] == 1 and hit["id"] == rows[0][2] and hit["text"], name
    assert len(list((tmp_path / "work").glob("*/dense-index/index/index.json"))) == 2  # one index per checkpoint, under its own name
    assert [p.relative_to(tmp_path / "work").parts[0] for p in (tmp_path / "work").rglob("bm25-index")] == ["bm25-index"]  # one, shared


def test_search_reuses_the_index_until_the_checkpoint_or_corpus_changes(tmp_path, trained, monkeypatch):
    import taser.pipeline.encode as encode
    from taser import Searcher

    searcher = Searcher(BEIR, trained, work_dir=tmp_path / "work")
    first = searcher.search(["a question about science"], k=5)
    monkeypatch.setattr(encode, "encode_corpus", lambda *a, **k: pytest.fail("encoded the corpus again"))
    assert Searcher(BEIR, trained, work_dir=tmp_path / "work").search(["a question about science"], k=5) == first
    monkeypatch.undo()
    changed = tmp_path / "corpus.jsonl"
    changed.write_text((BEIR / "corpus.jsonl").read_text().splitlines()[0] + "\n")
    encoded = []
    real = encode.encode_corpus
    monkeypatch.setattr(encode, "encode_corpus", lambda *a, **k: encoded.append(a[1]) or real(*a, **k))
    assert len(Searcher(changed, trained, work_dir=tmp_path / "work").search(["a question"], k=5)["q1"]) == 1  # one document
    assert encoded, "another corpus was not encoded"


def run_search(*overrides: str, cwd: Path) -> subprocess.CompletedProcess:
    env_python = [sys.executable, str(ROOT / "scripts" / "search.py")]
    return subprocess.run([*env_python, *overrides], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"})


@pytest.mark.slow
def test_the_command_ranks_a_beir_corpus_and_refuses_bad_input_in_one_line(tmp_path, trained):
    done = run_search(f"corpus={BEIR}", f"queries={BEIR / 'queries.jsonl'}", f"checkpoint={trained}", "k=4", f"out_dir={tmp_path / 'run'}",
                      f"work_dir={tmp_path / 'work'}", "precision=fp32", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "queries ranked" in done.stdout and len(trec_lines(tmp_path / "run" / "run.trec")) == 4 * len(read_queries(BEIR / "queries.jsonl"))
    for overrides, says in [((f"corpus={tmp_path / 'absent.jsonl'}", f"checkpoint={trained}"), "corpus"),
                            ((f"corpus={BEIR}", f"checkpoint={tmp_path / 'absent'}"), "does not exist"),
                            ((f"corpus={BEIR}", f"checkpoint={tmp_path}"), "no config.json")]:
        start = time.perf_counter()
        bad = run_search(*overrides, f"queries={BEIR / 'queries.jsonl'}", f"out_dir={tmp_path / 'bad'}", cwd=tmp_path)
        assert bad.returncode == 2 and says in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
        assert len(bad.stderr.strip().splitlines()) == 1 and time.perf_counter() - start < 30, bad.stderr
        assert not (tmp_path / "bad" / "run.trec").exists()


@pytest.mark.parametrize("script, given, says", [("evaluate", "absent", "does not exist"), ("encode_passages", "empty", "is not a checkpoint"),
                                                 ("evaluate", "empty", "no config.json")])
def test_evaluate_and_encode_refuse_a_checkpoint_that_is_not_one_in_one_line(tmp_path, script, given, says):
    (tmp_path / "empty").mkdir()
    (tmp_path / "p.tsv").write_text("id\ttext\ttitle\n1\tx\tX\n")
    (tmp_path / "q.tsv").write_text("who?\t['x']\n")
    start = time.perf_counter()
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / f"{script}.py"), f"checkpoint={tmp_path / given}", f"out_dir={tmp_path / 'out'}",
                           "passages=p.tsv", *(["retriever=dense", "qa_file=q.tsv"] if script == "evaluate" else ["shard_id=0", "num_shards=1"])],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120, env={**__import__("os").environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 2 and says in done.stderr and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert len(done.stderr.strip().splitlines()) == 1 and time.perf_counter() - start < 30


def test_a_commands_checkpoint_is_a_directory_as_given_or_a_release_converted(released_pair, trained):
    from taser.cli import checkpoint_or_exit
    from taser.pipeline.released import RELEASED, released_dir

    assert checkpoint_or_exit(str(trained)) == str(trained)  # as given: results.json records what the user typed
    converted = checkpoint_or_exit(released_pair)
    assert converted == str(released_dir(RELEASED[released_pair].source)) and (Path(converted) / "config.json").is_file()


def test_the_readmes_first_search_runs_as_written_on_the_quickstarts_outputs(tmp_path, trained):
    """The README's block after `make quickstart`, line by line in bash, in a directory holding what the quickstart
    leaves (its passages and a trained model; here a tiny one): a ranked list for one's own queries, no download."""
    import re
    import shutil

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"right after `make quickstart`.*?```bash\n(.*?)```", readme, re.S).group(1)
    work = tmp_path / "clone"
    (work / "outputs" / "quickstart" / "data").mkdir(parents=True)
    shutil.copytree(trained, work / "outputs" / "quickstart" / "trained" / "final")
    (work / "outputs" / "quickstart" / "data" / "passages.tsv").write_text(
        "id\ttext\ttitle\n1\tDenver won Super Bowl 50.\tSuper Bowl 50\n2\tThe Normans came from Normandy.\tNormans\n3\tWarsaw is in Poland.\tWarsaw\n")
    (work / ".venv").symlink_to(ROOT / ".venv")
    env = {**__import__("os").environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(["bash", "-e", "-c", block], cwd=work, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    run = [line.split() for line in (work / "outputs" / "search" / "first" / "run.trec").read_text().splitlines()]
    assert [r[0] for r in run] == ["q1"] * 3 + ["q2"] * 3 and all(len(r) == 6 for r in run)
