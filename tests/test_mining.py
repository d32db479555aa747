"""Hard-negative mining and distant supervision: unit rules, BM25 and dense mining on real SQuAD
paragraphs, and scripts/mine_negatives.py end to end."""

import json
import subprocess
import sys

import pytest
from conftest import ROOT, tiny_model_cfg

from taser.data.biencoder_json import BiEncoderJsonFile, write_biencoder_json
from taser.data.passage_store import PassageStore
from taser.data.passages import Passage, read_passages, write_passages
from taser.data.qa import QAPair, write_qa
from taser.evaluation.answers import has_answer
from taser.retrieval.mining import mine_hard_negatives, mine_record, summary_path

PASSAGES = {p.id: p for p in [
    Passage("1", "The capital of France is Paris.", "France"),
    Passage("2", "Lyon is a city in France.", "Lyon"),
    Passage("3", "Paris hosted the 1900 Olympics.", "Paris"),
    Passage("4", "Marseille is a port.", "Marseille"),
    Passage("5", "Nice is on the coast.", "Nice"),
]}
RANKED = [("3", 9.0), ("2", 8.0), ("1", 7.0), ("4", 6.0), ("5", 5.0)]


def record(question="capital of France?", answers=("Paris",), positives=()):
    return {"question": question, "answers": list(answers), "positive_ctxs": list(positives),
            "negative_ctxs": [], "hard_negative_ctxs": [{"title": "old", "text": "replaced"}]}


def ids(ctxs):
    return [c["passage_id"] for c in ctxs]


def test_hard_negatives_skip_answers_and_the_positive():
    gold = {"title": "Lyon", "text": "Lyon is a city in France.", "passage_id": "2"}
    out = mine_record(record(positives=[gold]), RANKED, PASSAGES, num_hard_negatives=30)
    assert ids(out["hard_negative_ctxs"]) == ["4", "5"]  # 3 and 1 hold "Paris"; 2 is the positive
    assert out["hard_negative_ctxs"][0] == {"title": "Marseille", "text": "Marseille is a port.", "score": 6.0, "passage_id": "4"}
    assert out["positive_ctxs"] == [gold]
    assert ids(mine_record(record(positives=[gold]), RANKED, PASSAGES, num_hard_negatives=1)["hard_negative_ctxs"]) == ["4"]
    # a positive without passage_id is recognised by its text
    no_id = {"title": "Lyon", "text": " Lyon is a city in France. "}
    assert ids(mine_record(record(positives=[no_id]), RANKED, PASSAGES)["hard_negative_ctxs"]) == ["4", "5"]
    # regex answers (CuratedTREC)
    out = mine_record(record(answers=[r"Pa\w+s"], positives=[gold]), RANKED, PASSAGES, match="regex")
    assert ids(out["hard_negative_ctxs"]) == ["4", "5"]


def test_distant_supervision_takes_the_best_ranked_answer_passage():
    out = mine_record(record(), RANKED, PASSAGES)
    assert out["positive_ctxs"] == [{"title": "Paris", "text": "Paris hosted the 1900 Olympics.", "score": 9.0, "passage_id": "3"}]
    assert ids(out["hard_negative_ctxs"]) == ["2", "4", "5"]
    assert mine_record(record(answers=["Berlin"]), RANKED, PASSAGES) is None
    assert mine_record(record(), [], PASSAGES) is None


def test_distant_positives_replace_the_gold_one_with_the_best_ranked_answer_passage():
    """DPR's Table 5: the same questions, each positive the retriever's best passage holding an answer."""
    gold = {"title": "France", "text": "The capital of France is Paris.", "passage_id": "1"}
    kept = mine_record(record(positives=[gold]), RANKED, PASSAGES)
    assert kept["positive_ctxs"] == [gold]  # by default a given positive stays
    out = mine_record(record(positives=[gold]), RANKED, PASSAGES, distant_positives=True)
    assert out["positive_ctxs"] == [{"title": "Paris", "text": "Paris hosted the 1900 Olympics.", "score": 9.0, "passage_id": "3"}]
    assert ids(out["hard_negative_ctxs"]) == ["2", "4", "5"]  # the gold passage holds the answer: never a negative
    # a question whose ranking holds no answer is dropped, though it had a gold passage
    assert mine_record(record(positives=[gold]), [("2", 1.0), ("4", 0.5)], PASSAGES, distant_positives=True) is None


def test_mining_with_distant_positives_counts_every_written_question_as_distant(tmp_path):
    gold = {"title": "Lyon", "text": "Lyon is a city in France.", "passage_id": "2"}
    source = tmp_path / "in.json"
    write_biencoder_json(source, [record(positives=[gold]), record(question="q2", answers=["Nice"], positives=[gold])])
    summary = mine_hard_negatives(source, tmp_path / "out.json", fake_search(lambda q: RANKED), PASSAGES_STORE, top_n=5, progress=False,
                                  distant_positives=True)
    assert (summary["written"], summary["distant_positives"], summary["positives"]) == (2, 2, "distant")
    out = list(BiEncoderJsonFile(tmp_path / "out.json"))
    assert [ids(r["positive_ctxs"]) for r in out] == [["3"], ["5"]]


class _Store:
    def get_many(self, pids):
        return {pid: PASSAGES[pid] for pid in pids}


PASSAGES_STORE = _Store()


def fake_search(ranking):
    return lambda questions, k: [ranking(q)[:k] for q in questions]


def test_mining_a_qa_file_streams_blocks_and_counts_drops(tmp_path):
    tsv = tmp_path / "passages.tsv"
    write_passages(tsv, PASSAGES.values())
    qa = tmp_path / "q.qa.tsv"
    pairs = [QAPair(f"q{i}", ["Paris"] if i % 3 else ["Berlin"]) for i in range(10)]  # 4 without an answer passage
    write_qa(qa, pairs)
    out = tmp_path / "mined" / "q.json"
    seen, calls = [], []

    def ranking(q):
        seen.append(q)
        return RANKED if q != "q1" else RANKED[3:]  # q1: no "Paris" passage in its top-N either

    def search(questions, k):
        calls.append(len(questions))
        return fake_search(ranking)(questions, k)

    with PassageStore(tsv) as store:
        summary = mine_hard_negatives(qa, out, search, store, top_n=4, num_hard_negatives=2,
                                      block_size=3, progress=False, meta={"retriever": "fake"})
    assert seen == [p.question for p in pairs]
    assert calls == [3, 3, 3, 1]  # one batched search per block
    records = list(BiEncoderJsonFile(out))
    assert [r["question"] for r in records] == ["q2", "q4", "q5", "q7", "q8"]
    assert all(ids(r["positive_ctxs"]) == ["3"] and ids(r["hard_negative_ctxs"]) == ["2", "4"] for r in records)
    assert summary == json.loads(summary_path(out).read_text())
    assert summary_path(out).name == "q.summary.json"
    assert {k: summary[k] for k in ("retriever", "questions", "written", "dropped_no_positive", "distant_positives",
                                     "mean_hard_negatives", "top_n")} == {
        "retriever": "fake", "questions": 10, "written": 5, "dropped_no_positive": 5, "distant_positives": 5,
        "mean_hard_negatives": 2.0, "top_n": 4}
    with pytest.raises(ValueError, match="must be a new file"):
        mine_hard_negatives(out, out, fake_search(ranking), PASSAGES, progress=False)


def check_mined(path, source, passages_tsv, num):
    """Every record: no hard negative holds an answer or is the positive; the ctxs are real passages."""
    corpus = {p.id: p for p in read_passages(passages_tsv)}
    mined = list(BiEncoderJsonFile(path))
    assert mined and len(mined) <= len(source)
    total = 0
    for r in mined:
        negs = r["hard_negative_ctxs"]
        assert len(negs) <= num
        pos_ids = {str(c.get("passage_id")) for c in r["positive_ctxs"]}
        for ctx in negs:
            assert not has_answer(r["answers"], ctx["text"], "string")
            assert ctx["passage_id"] not in pos_ids
            assert corpus[ctx["passage_id"]] == Passage(ctx["passage_id"], ctx["text"], ctx["title"])
        assert [c["score"] for c in negs] == sorted((c["score"] for c in negs), reverse=True)
        total += len(negs)
    return mined, total / len(mined)


def test_bm25_mining_on_squad(mini_squad, tmp_path):
    from taser.pipeline.mine import mine_negatives

    src = mini_squad / "train.json"
    before = src.read_bytes()
    out = tmp_path / "train.bm25.json"
    summary = mine_negatives(src, mini_squad / "passages.tsv", out, bm25={"backend": "bm25s"}, num_hard_negatives=5, progress=False)
    assert src.read_bytes() == before  # the input is untouched
    source = list(BiEncoderJsonFile(src))
    mined, mean = check_mined(out, source, mini_squad / "passages.tsv", 5)
    assert len(mined) == len(source) == summary["written"] and summary["dropped_no_positive"] == 0
    assert [r["positive_ctxs"] for r in mined] == [r["positive_ctxs"] for r in source]
    assert [r["negative_ctxs"] for r in mined] == [r["negative_ctxs"] for r in source]
    assert summary["mean_hard_negatives"] == pytest.approx(mean, abs=0.01) and mean > 4.9
    assert (tmp_path / "bm25-bm25s" / "bm25.json").is_file()  # default index location: beside the output


@pytest.fixture(scope="module")
def tiny_dense(mini_squad, tiny_pretrained, tmp_path_factory):
    """A tiny random bi-encoder checkpoint and its flat index over the mini SQuAD corpus."""
    from taser.pipeline.encode import encode_corpus
    from taser.pipeline.experiment import save_initial
    from taser.pipeline.index import build_index
    from taser.retrieval.index_types import IndexConfig

    out = tmp_path_factory.mktemp("tiny-dense")
    ckpt = save_initial(tiny_model_cfg(tiny_pretrained), out)
    encode_corpus(ckpt, mini_squad / "passages.tsv", out / "emb", batch_size=64, progress=False)
    build_index(out / "emb", out / "index", IndexConfig("flat"))
    return ckpt, out / "index"


def test_dense_mining_with_distant_supervision(mini_squad, tiny_dense, tmp_path):
    from taser.pipeline.mine import mine_negatives

    ckpt, index = tiny_dense
    qa_lines = (mini_squad / "train.qa.tsv").read_text().splitlines()
    out = tmp_path / "train.dense.json"
    summary = mine_negatives(mini_squad / "train.qa.tsv", mini_squad / "passages.tsv", out, retriever="dense",
                             checkpoint=ckpt, index=index, top_n=20, num_hard_negatives=3, block_size=64,
                             offsets_cache=tmp_path / "offsets.npz", progress=False)
    assert summary["questions"] == len(qa_lines) and summary["retriever"] == "dense"
    assert summary["written"] + summary["dropped_no_positive"] == len(qa_lines)
    assert summary["distant_positives"] == summary["written"] > 0 and summary["dropped_no_positive"] > 0
    mined, _ = check_mined(out, qa_lines, mini_squad / "passages.tsv", 3)
    for r in mined:  # each positive came from retrieval and holds an answer
        assert len(r["positive_ctxs"]) == 1 and has_answer(r["answers"], r["positive_ctxs"][0]["text"])
    assert (tmp_path / "offsets.npz").is_file()
    with pytest.raises(ValueError, match="needs a checkpoint"):
        mine_negatives(mini_squad / "train.qa.tsv", mini_squad / "passages.tsv", tmp_path / "x.json", retriever="dense")


def test_mining_from_a_retrieval_already_made_equals_mining_with_its_retriever(mini_squad, tiny_dense, tmp_path):
    """A table's dense-negatives stage mines from the `uses` row's retrieval of the training questions
    (the stage a reader row on that retriever shares): the same records as searching again."""
    from taser.pipeline.evaluate import evaluate_dense
    from taser.pipeline.mine import mine_negatives

    ckpt, index = tiny_dense
    qa, passages = mini_squad / "train.qa.tsv", mini_squad / "passages.tsv"
    evaluate_dense(ckpt, index, qa, passages, tmp_path / "retrieved", k=20, precision="fp32", device="cpu")
    common = {"top_n": 20, "num_hard_negatives": 3, "block_size": 7, "progress": False}
    live = mine_negatives(qa, passages, tmp_path / "live.json", retriever="dense", checkpoint=ckpt, index=index, precision="fp32",
                          device="cpu", **common)
    given = mine_negatives(qa, passages, tmp_path / "given.json", retriever="retrieval", retrieval=tmp_path / "retrieved" / "retrieval.json",
                           retrieved_k=20, **common)
    assert json.loads((tmp_path / "given.json").read_text()) == json.loads((tmp_path / "live.json").read_text())
    assert given["retriever"] == "retrieval" and given["retrieved_k"] == 20
    assert {k: given[k] for k in ("questions", "written", "mean_hard_negatives")} == {k: live[k] for k in ("questions", "written", "mean_hard_negatives")}
    with pytest.raises(ValueError, match=r"holds the top 20 passages of each question; mining reads the first 30"):
        mine_negatives(qa, passages, tmp_path / "x.json", retriever="retrieval", retrieval=tmp_path / "retrieved" / "retrieval.json",
                       retrieved_k=20, top_n=30, progress=False)
    assert not (tmp_path / "x.json").exists()  # refused before anything is written
    with pytest.raises(ValueError, match="needs the retrieval file"):
        mine_negatives(qa, passages, tmp_path / "x.json", retriever="retrieval")


def test_a_retrieval_of_other_questions_is_refused_naming_the_record(tmp_path):
    from taser.data.retrieval_json import write_retrieval_results
    from taser.retrieval.mining import retrieval_searcher

    path = tmp_path / "retrieval.json"
    ctxs = [{"id": str(i), "title": "", "text": "", "score": 10 - i, "has_answer": False} for i in range(5)]
    write_retrieval_results(path, [{"question": q, "answers": ["a"], "ctxs": ctxs} for q in ("first?", "second?")])
    search = retrieval_searcher(path, 5)
    assert search(["first?"], 2) == [[("0", 10.0), ("1", 9.0)]]  # records read in order, the first k of each
    with pytest.raises(ValueError, match=r"record 1: question 'second\?', but the file mined has 'third\?' there"):
        search(["third?"], 2)
    search = retrieval_searcher(path, 5)
    with pytest.raises(ValueError, match=r"ends before the question 'third\?'"):
        search(["first?", "second?", "third?"], 5)


def test_mine_negatives_script(mini_squad, tmp_path):
    src = tmp_path / "first50.json"
    write_biencoder_json(src, list(BiEncoderJsonFile(mini_squad / "train.json"))[:50])
    out = tmp_path / "out" / "mined.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "mine_negatives.py"), f"data.data_dir={mini_squad}", f"input={src}",
         f"output={out}", "bm25.backend=bm25s", f"bm25.index_dir={tmp_path / 'bm25'}", "num_hard_negatives=4",
         "top_n=50", "progress=false", f"hydra.run.dir={tmp_path / 'hydra'}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    assert summary["written"] == 50 and summary["backend"] == "bm25s" and summary["num_hard_negatives"] == 4
    check_mined(out, list(range(50)), mini_squad / "passages.tsv", 4)
