"""The SQuAD converter on the shipped real data: the benchmark's sanity figures."""

import json

from conftest import SQUAD

from taser.data.biencoder_json import BiEncoderJsonFile
from taser.data.passages import read_passages
from taser.data.qa import read_qa
from taser.data.splitter import split_words
from taser.evaluation.answers import has_answer


def test_split_words_disjoint_blocks():
    text = " ".join(f"w{i}" for i in range(250))
    blocks = split_words(text, 100)
    assert [b.start_word for b in blocks] == [0, 100, 200]
    assert [len(b.text.split()) for b in blocks] == [100, 100, 50]
    assert " ".join(b.text for b in blocks) == text
    assert split_words("", 100) == []


def test_convert_full_benchmark(tmp_path):
    from taser.data.squad import convert_squad

    summary = convert_squad(SQUAD, tmp_path, train_articles=30, random_negatives=3)
    assert summary["passages"] == 2141
    assert summary["train"]["questions"] == 7010 and summary["train"]["with_positive"] == 6924
    assert summary["train"]["unmatched"] == 86
    assert summary["dev"]["questions"] == 1971
    assert json.loads((tmp_path / "summary.json").read_text()) == summary
    passages = list(read_passages(tmp_path / "passages.tsv"))
    assert len(passages) == 2141 and all(len(p.text.split()) <= 100 and p.title for p in passages)
    assert len(list(read_qa(tmp_path / "dev.qa.tsv"))) == 1971
    train = BiEncoderJsonFile(tmp_path / "train.json")
    assert len(train) == 6924
    by_id = {p.id: p for p in passages}
    matched = 0
    for record in train:
        positive = record["positive_ctxs"][0]
        assert by_id[positive["passage_id"]].text == positive["text"]
        matched += has_answer(record["answers"], positive["text"])
    # the positive holds the annotated span; DPR's token match misses a few (e.g. "5" inside "1.5")
    assert matched / len(train) > 0.99
    for record in list(train)[:300]:
        positive = record["positive_ctxs"][0]
        assert len(record["negative_ctxs"]) == 3
        assert positive["passage_id"] not in {c["passage_id"] for c in record["negative_ctxs"]}
    # train and dev are split by article: no dev title among training positives
    dev_titles = {r["positive_ctxs"][0]["title"] for r in BiEncoderJsonFile(tmp_path / "dev.json")}
    assert dev_titles.isdisjoint({r["positive_ctxs"][0]["title"] for r in train})
