"""Out-of-domain evaluation on tiny data in the real formats (tests/fixtures/beir-tiny,
tests/fixtures/entity-questions-tiny): the readers and their errors, BEIR's metrics against
BEIR's own recipe (pytrec_eval over the TREC run file written), a query without hits, another
split, the reuse of the converted corpus and of the dense index (and their rebuilding when the
corpus or the checkpoint changes), EntityQuestions' macro average, and scripts/evaluate.py end
to end (dense with the tiny model, BM25)."""

import json
import shutil
import subprocess
import sys

import pytest
import pytrec_eval
from conftest import FIXTURES, ROOT, tiny_model_cfg

from taser.data.beir import beir_files, beir_passages, read_beir_split, write_beir_passages
from taser.data.entity_questions import read_entity_questions, relation_files
from taser.data.errors import DataFormatError
from taser.data.passages import Passage, read_passages
from taser.data.trec import write_trec_run
from taser.pipeline.evaluate import RetrieverSettings
from taser.pipeline.evaluate_ood import evaluate_beir, evaluate_entity_questions
from taser.retrieval.bm25 import BM25Settings

BEIR = FIXTURES / "beir-tiny"
EQ = FIXTURES / "entity-questions-tiny"
BM25S = RetrieverSettings("bm25", bm25=BM25Settings(backend="bm25s"))


def beir_recipe(qrels_tsv, run_file, ignore_identical_ids=True):
    """BEIR's EvaluateRetrieval.evaluate, restated: pop identical ids, pytrec_eval, mean over the scored queries."""
    with open(qrels_tsv) as f:
        rows = [line.rstrip("\n").split("\t") for line in f.readlines()[1:] if line.strip()]
    qrels = {}
    for qid, docid, score in rows:
        qrels.setdefault(qid, {})[docid] = int(score)
    with open(run_file) as f:
        results = pytrec_eval.parse_run(f)
    if ignore_identical_ids:
        for qid in results:
            results[qid].pop(qid, None)
    scores = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10", "recall.100"}).evaluate(results)
    return {"nDCG@10": sum(s["ndcg_cut_10"] for s in scores.values()) / len(scores),
            "Recall@100": sum(s["recall_100"] for s in scores.values()) / len(scores), "queries": len(scores)}


# --- readers -------------------------------------------------------------------------------


def test_beir_split_and_corpus_conversion(tmp_path):
    files = beir_files(BEIR)
    assert files.name == "beir-tiny"
    queries, qrels = read_beir_split(files)
    assert list(queries) == ["q1", "q2", "q3", "q4", "q6"]  # the judged queries, in qrels order; q5 has no judgement
    stats = write_beir_passages(files.corpus, tmp_path / "p.tsv")
    assert stats == {"documents": 11, "title_as_text": 1, "skipped_empty": 1}
    passages = {p.id: p for p in read_passages(tmp_path / "p.tsv")}
    assert passages["d9"] == Passage("d9", "Plate tectonics", "") and "d12" not in passages
    assert passages["d11"].title == "" and passages["q3"].title == "Cell nucleus"


def test_beir_errors_name_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="qrels \\(dev split\\) file not found"):
        beir_files(BEIR, "dev")
    bad = tmp_path / "bad"
    shutil.copytree(BEIR, bad)
    (bad / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq77\td2\t1\n")
    with pytest.raises(DataFormatError, match="1 query id\\(s\\) not in .*queries.jsonl: 'q77'"):
        read_beir_split(beir_files(bad))
    (bad / "corpus.jsonl").write_text('{"_id": "a", "text": "x"}\n\n{"_id": "a", "text": "y"}\n')
    with pytest.raises(DataFormatError, match="corpus.jsonl, line 3: duplicate document id 'a'"):
        list(beir_passages(bad / "corpus.jsonl"))


def test_trec_run_file(tmp_path):
    path = tmp_path / "run.trec"
    assert write_trec_run(path, {"q1": [("d1", 2.5), ("d2", 1 / 3)], "q2": []}, tag="t") == 2
    assert path.read_text().splitlines()[1] == f"q1 Q0 d2 2 {1 / 3!r} t"
    with open(path) as f:
        assert pytrec_eval.parse_run(f) == {"q1": {"d1": 2.5, "d2": 1 / 3}}
    with pytest.raises(ValueError, match="document id 'a b'"):
        write_trec_run(tmp_path / "x.trec", {"q": [("a b", 1.0)]})
    assert not (tmp_path / "x.trec").exists()


def test_entity_questions_layouts_and_errors(tmp_path):
    relations = read_entity_questions(EQ)  # the parent of test/ works too
    assert list(relations) == ["P17", "P20"]
    assert [len(v) for v in relations.values()] == [4, 2]
    assert relations["P20"][0].question == "Where did Francesco Guardi die?" and relations["P20"][0].answers == ["Venice"]
    # the same relation as .json and .jsonl: the .json is read; relations sort by Wikidata number
    d = tmp_path / "test"
    d.mkdir()
    (d / "P106.test.jsonl").write_text('{"question": "What kind of work does X do?", "answers": ["painter"]}\n')
    (d / "P17.test.json").write_text('[{"question": "Which country is X located in?", "answers": ["Italy"]}]')
    (d / "P17.test.jsonl").write_text("not read\n")
    assert list(relation_files(d)) == ["P17", "P106"]
    assert read_entity_questions(d)["P17"][0].answers == ["Italy"]
    for text, message in [
        ('[{"question": "q", "answers": []}]', "record 0: 'answers' must be a non-empty list"),
        ('{"question": "q"}', "top level: expected a JSON list"),
        ('[{"question": "q", "answers": ["a"]}, {"answers": ["a"]}]', r"record 1: missing field\(s\) \['question'\]"),
        ("[", "invalid JSON"),
    ]:
        (d / "P17.test.json").write_text(text)
        with pytest.raises(DataFormatError, match=message) as e:
            read_entity_questions(d)
        assert e.value.path == str(d / "P17.test.json")
    (d / "P17.test.json").unlink()
    (d / "P17.test.jsonl").unlink()
    (d / "P106.test.jsonl").write_text('{"question": "q", "answers": ["a"]}\n{"question": \n')
    with pytest.raises(DataFormatError, match="P106.test.jsonl, line 2: invalid JSON"):
        read_entity_questions(d)
    with pytest.raises(FileNotFoundError, match="no EntityQuestions files"):
        read_entity_questions(tmp_path / "test", split="dev")


# --- evaluation ----------------------------------------------------------------------------


def test_beir_bm25_metrics_are_beirs(tmp_path):
    out = tmp_path / "bm25"
    results = evaluate_beir(BM25S, BEIR, out, work_dir=tmp_path / "work")
    assert results["queries"] == results["queries_scored"] == 5
    assert results["identical_ids_dropped"] == 1  # q3's own document
    recipe = beir_recipe(BEIR / "qrels" / "test.tsv", out / "run.trec")
    assert results["metrics"]["nDCG@10"] == pytest.approx(recipe["nDCG@10"], abs=1e-5)
    assert results["metrics"]["Recall@100"] == pytest.approx(recipe["Recall@100"], abs=1e-5)
    assert len(results["top_k_curve"]) == 100 and results["top_k_curve"] == sorted(results["top_k_curve"])
    assert json.loads((out / "results.json").read_text()) == results
    assert (tmp_path / "work" / "passages.tsv").is_file() and (tmp_path / "work" / "bm25-bm25s" / "bm25.json").is_file()
    # the identical-id rule is a setting: off, q3 finds its own document
    kept = evaluate_beir(BM25S, BEIR, tmp_path / "kept", ignore_identical_ids=False, work_dir=tmp_path / "work")
    assert kept["identical_ids_dropped"] == 0 and kept["metrics"]["nDCG@10"] > results["metrics"]["nDCG@10"]
    recipe = beir_recipe(BEIR / "qrels" / "test.tsv", tmp_path / "kept" / "run.trec", ignore_identical_ids=False)
    assert kept["metrics"]["nDCG@10"] == pytest.approx(recipe["nDCG@10"], abs=1e-5)


def beir_copy(tmp_path, name="beir"):
    """A copy of the tiny BEIR dataset that a test may change."""
    return shutil.copytree(BEIR, tmp_path / name)


def append(path, text):
    with open(path, "a") as f:
        f.write(text)


def test_beir_query_without_hits_counts_zero(tmp_path):
    """Catches a judged query that retrieves nothing being left out of the means instead of
    scoring 0 (BEIR's convention, `taser.evaluation.ir_metrics`): it would inflate every figure."""
    beir = beir_copy(tmp_path)
    append(beir / "queries.jsonl", '{"_id": "q7", "text": "zyzzyva qwxzt"}\n')  # no term of the corpus: BM25 finds nothing
    append(beir / "qrels" / "test.tsv", "q7\td1\t1\n")
    results = evaluate_beir(BM25S, beir, tmp_path / "out", work_dir=tmp_path / "work")
    without = evaluate_beir(BM25S, BEIR, tmp_path / "without", work_dir=tmp_path / "work-without")  # the 5 other queries
    assert results["queries"] == results["queries_scored"] == 6 and without["queries_scored"] == 5
    assert not any(line.startswith("q7 ") for line in (tmp_path / "out" / "run.trec").read_text().splitlines())
    for key in ("nDCG@10", "Recall@100", "MRR@10"):
        assert without["metrics"][key] > 0 and results["metrics"][key] == pytest.approx(without["metrics"][key] * 5 / 6, abs=1e-5), key
    assert results["top_k_curve"] == pytest.approx([v * 5 / 6 for v in without["top_k_curve"]], abs=0.01)
    assert results["metrics"]["nDCG@10"] < beir_recipe(beir / "qrels" / "test.tsv", tmp_path / "out" / "run.trec")["nDCG@10"]  # not the mean over 5


def dev_split(tmp_path):
    beir = beir_copy(tmp_path)
    (beir / "qrels" / "dev.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td2\t2\nq2\td5\t1\nq4\td10\t1\n")  # other judgements than test's
    return beir


def test_beir_dev_split(tmp_path):
    """Catches `split` not reaching the qrels read (test.tsv judged instead of dev.tsv)."""
    beir = dev_split(tmp_path)
    results = evaluate_beir(BM25S, beir, tmp_path / "dev", split="dev", work_dir=tmp_path / "work")
    assert results["split"] == "dev" and results["queries"] == results["queries_scored"] == 3
    assert {line.split()[0] for line in (tmp_path / "dev" / "run.trec").read_text().splitlines()} == {"q1", "q2", "q4"}
    recipe = beir_recipe(beir / "qrels" / "dev.tsv", tmp_path / "dev" / "run.trec")
    assert recipe["queries"] == 3 and results["metrics"]["nDCG@10"] == pytest.approx(recipe["nDCG@10"], abs=1e-5)
    test = evaluate_beir(BM25S, beir, tmp_path / "test", work_dir=tmp_path / "work")
    assert test["metrics"]["nDCG@10"] != results["metrics"]["nDCG@10"]


def test_beir_reuses_its_corpus_and_dense_index_until_they_change(tmp_path, tiny_checkpoint, monkeypatch):
    """Catches the converted corpus or `dense-index/` rebuilt on every run (hours on a large
    corpus), or reused after `corpus.jsonl` or the checkpoint changed (stale passages or vectors),
    or a rebuild stopped by vectors of the old corpus that a killed run left behind."""
    import torch

    import taser.pipeline.encode as encode_stage
    import taser.pipeline.evaluate_ood as ood
    from taser.models.loading import load_checkpoint

    calls = {"convert": 0, "encode": 0}
    convert, encode = ood.write_beir_passages, encode_stage.encode_corpus

    def counted(name, function):
        def spy(*args, **kwargs):
            calls[name] += 1
            return function(*args, **kwargs)
        return spy

    monkeypatch.setattr(ood, "write_beir_passages", counted("convert", convert))
    monkeypatch.setattr(encode_stage, "encode_corpus", counted("encode", encode))
    beir, out, work = beir_copy(tmp_path), tmp_path / "dense", tmp_path / "work"
    passages, index = work / "passages.tsv", out / "dense-index" / "index" / "index.faiss"

    def run():
        return evaluate_beir(RetrieverSettings("dense", tiny_checkpoint, device="cpu"), beir, out, work_dir=work)

    def stamp(path):
        st = path.stat()
        return st.st_ino, st.st_mtime_ns

    first = run()
    assert calls == {"convert": 1, "encode": 1} and first["documents"] == 11
    corpus_stamp, index_stamp = stamp(passages), stamp(index)
    second = run()  # nothing changed: nothing converted, encoded or rewritten
    assert calls == {"convert": 1, "encode": 1} and (stamp(passages), stamp(index)) == (corpus_stamp, index_stamp)
    assert second["metrics"] == first["metrics"]

    # the corpus changes; vectors of the old one were left by a run killed before building its index
    encode(tiny_checkpoint, passages, out / "dense-index" / "embeddings", 0, 1, device="cpu", progress=False)
    append(beir / "corpus.jsonl", '{"_id": "d13", "title": "Marie Curie", "text": "Marie Curie won the Nobel prize for research on radioactivity."}\n')
    third = run()
    assert calls == {"convert": 2, "encode": 2} and third["documents"] == 12
    assert stamp(passages) != corpus_stamp and stamp(index) != index_stamp
    assert "d13" in {line.split()[2] for line in (out / "run.trec").read_text().splitlines()}  # the new document is searched
    corpus_stamp, index_stamp, third_run = stamp(passages), stamp(index), (out / "run.trec").read_text()

    # the checkpoint changes (retrained at the same path): the corpus is kept, the vectors are not
    model, tokenizer = load_checkpoint(tiny_checkpoint, "cpu")
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    model.save(tiny_checkpoint, tokenizer)
    fourth = run()
    assert calls == {"convert": 2, "encode": 3} and stamp(passages) == corpus_stamp and stamp(index) != index_stamp
    assert (out / "run.trec").read_text() != third_run and fourth["documents"] == 12  # scored by the new vectors
    assert not (out / "dense-index" / "embeddings").exists()  # the scratch vectors are removed once indexed


def test_bad_beir_input_writes_nothing(tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(BEIR, bad)
    (bad / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\tyes\n")
    with pytest.raises(DataFormatError, match="test.tsv, line 2: score must be an integer"):
        evaluate_beir(BM25S, bad, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_entity_questions_macro_average(tmp_path):
    out = tmp_path / "eq"
    settings = RetrieverSettings("bm25", bm25=BM25Settings(backend="bm25s", index_dir=str(tmp_path / "bm25")))
    results = evaluate_entity_questions(settings, EQ / "test", EQ / "passages.tsv", out)
    assert results["relations"]["P17"] == {"questions": 4, "top_k": {"1": 75.0, "5": 75.0, "20": 75.0, "100": 75.0}}
    assert results["relations"]["P20"]["top_k"]["20"] == 100.0
    assert results["top_k"]["20"] == 87.5 and results["top_k"]["100"] == 87.5  # macro: (75 + 100) / 2
    assert results["top_k_micro"]["20"] == pytest.approx(5 / 6 * 100, abs=0.01)
    assert results["top_k_curve"][19] == 87.5
    p17 = json.loads((out / "retrieval" / "P17.test.json").read_text())
    assert len(p17) == 4 and p17[0]["ctxs"][0]["has_answer"] is True
    assert json.loads((out / "results.json").read_text())["task"] == "entity_questions"


# --- scripts/evaluate.py end to end -------------------------------------------------------


def run(*overrides):
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "evaluate.py"), *overrides], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.fixture
def tiny_checkpoint(tmp_path, tiny_pretrained):
    from taser.models.loading import load_model

    model, tokenizer = load_model(tiny_model_cfg(tiny_pretrained, "dpr"))
    model.save(tmp_path / "ckpt", tokenizer)
    return tmp_path / "ckpt"


@pytest.mark.slow
def test_evaluate_script_on_a_beir_directory(tmp_path, tiny_checkpoint):
    common = ["task=beir", f"beir.dir={BEIR}", f"beir.work_dir={tmp_path / 'work'}"]
    dense = run(*common, f"checkpoint={tiny_checkpoint}", f"out_dir={tmp_path / 'dense'}", "name=tiny dpr")
    bm25 = run(*common, "retriever=bm25", "bm25.backend=bm25s", f"out_dir={tmp_path / 'bm25'}")
    for proc, out in ((dense, tmp_path / "dense"), (bm25, tmp_path / "bm25")):
        results = json.loads((out / "results.json").read_text())
        recipe = beir_recipe(BEIR / "qrels" / "test.tsv", out / "run.trec")
        assert results["metrics"]["nDCG@10"] == pytest.approx(recipe["nDCG@10"], abs=1e-5)
        assert f"nDCG@10 {recipe['nDCG@10']:.4f}" in proc.stdout
        assert results["task"] == "beir" and results["dataset"] == "beir-tiny" and results["ignore_identical_ids"] is True
    dense_results = json.loads((tmp_path / "dense" / "results.json").read_text())
    assert dense_results["name"] == "tiny dpr" and dense_results["parameters"] > 0
    assert (tmp_path / "dense" / "dense-index" / "index" / "index.json").is_file()  # no index given: a flat one was built


@pytest.mark.slow
def test_evaluate_script_on_a_beir_dev_split(tmp_path):
    """Catches `beir.split=dev` not reaching the evaluation from the command line."""
    beir = dev_split(tmp_path)
    proc = run("task=beir", f"beir.dir={beir}", "beir.split=dev", f"beir.work_dir={tmp_path / 'work'}", "retriever=bm25",
               "bm25.backend=bm25s", f"out_dir={tmp_path / 'out'}")
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["split"] == "dev" and results["queries"] == 3
    recipe = beir_recipe(beir / "qrels" / "dev.tsv", tmp_path / "out" / "run.trec")
    assert results["metrics"]["nDCG@10"] == pytest.approx(recipe["nDCG@10"], abs=1e-5)
    assert f"nDCG@10 {recipe['nDCG@10']:.4f}" in proc.stdout
