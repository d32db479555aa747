"""BEIR readers and DPR retrieval JSON: round trips and bad input naming file and line."""

import json

import numpy as np
import pytest

from taser.data.beir import read_beir_corpus, read_beir_qrels, read_beir_queries
from taser.data.errors import DataFormatError
from taser.data.passages import Passage
from taser.data.retrieval_json import read_retrieval_results, write_retrieval_results


def write_lines(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def jsonl(path, objects):
    return write_lines(path, [json.dumps(o, ensure_ascii=False) for o in objects])


# --- BEIR -------------------------------------------------------------------------------


def test_corpus_round_trip(tmp_path):
    path = jsonl(
        tmp_path / "corpus.jsonl",
        [
            {"_id": "d1", "title": "Röntgen", "text": "X-rays.", "metadata": {}},
            {"_id": 7, "text": "no title"},
            {"_id": "d3", "title": None, "text": ""},
        ],
    )
    assert list(read_beir_corpus(path)) == [
        Passage("d1", "X-rays.", "Röntgen"),
        Passage("7", "no title", ""),
        Passage("d3", "", ""),
    ]


def test_queries_round_trip(tmp_path):
    path = jsonl(tmp_path / "queries.jsonl", [{"_id": "q1", "text": "who?", "metadata": {}}, {"_id": "q2", "text": "what?"}])
    path.write_text(path.read_text() + "\n", encoding="utf-8")  # a trailing blank line is fine
    assert read_beir_queries(path) == {"q1": "who?", "q2": "what?"}


def test_qrels_round_trip(tmp_path):
    path = write_lines(tmp_path / "test.tsv", ["query-id\tcorpus-id\tscore", "q1\td1\t1", "q1\td2\t2", "q2\td1\t0", ""])
    assert read_beir_qrels(path) == {"q1": {"d1": 1, "d2": 2}, "q2": {"d1": 0}}


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"_id": "d2", "text": ', "invalid JSON"),
        ('["d2", "text"]', "expected a JSON object, got list"),
        ('{"text": "no id"}', "missing field '_id'"),
        ('{"_id": "", "text": "x"}', "'_id' must be a non-empty string"),
        ('{"_id": "d2", "title": "t"}', "missing field 'text'"),
        ('{"_id": "d2", "text": 3}', "field 'text' must be a string, got int"),
        ('{"_id": "d2", "text": "x", "title": 1}', "field 'title' must be a string"),
    ],
)
def test_corpus_errors_name_file_and_line(tmp_path, line, message):
    path = write_lines(tmp_path / "corpus.jsonl", ['{"_id": "d1", "text": "fine"}', "", line])
    with pytest.raises(DataFormatError, match=message) as e:
        list(read_beir_corpus(path))
    assert str(e.value).startswith(f"{path}, line 3: ")


def test_queries_errors(tmp_path):
    path = write_lines(tmp_path / "queries.jsonl", ['{"_id": "q1", "text": "a"}', '{"_id": "q1", "text": "b"}'])
    with pytest.raises(DataFormatError, match=r"line 2: duplicate query id 'q1'") as e:
        read_beir_queries(path)
    assert e.value.path == str(path)
    path = write_lines(tmp_path / "queries.jsonl", ['{"_id": "q1"}'])
    with pytest.raises(DataFormatError, match=r"queries.jsonl, line 1: missing field 'text'"):
        read_beir_queries(path)


@pytest.mark.parametrize(
    "lines, where, message",
    [
        (["q1\td1\t1"], "line 1", "expected the header"),
        ([], "line 1", "expected the header"),
        (["query-id\tcorpus-id\tscore", "q1\td1\t1", "q1\td2"], "line 3", "expected 3 tab-separated fields, got 2"),
        (["query-id\tcorpus-id\tscore", "q1\td1\thigh"], "line 2", "score must be an integer, got 'high'"),
        (["query-id\tcorpus-id\tscore", "q1\td1\t1.5"], "line 2", "score must be an integer"),
        (["query-id\tcorpus-id\tscore", "\td1\t1"], "line 2", "empty query-id or corpus-id"),
        (["query-id\tcorpus-id\tscore", "q1\td1\t1", "q1\td1\t2"], "line 3", "conflicting scores"),
    ],
)
def test_qrels_errors_name_file_and_line(tmp_path, lines, where, message):
    path = write_lines(tmp_path / "test.tsv", lines)
    with pytest.raises(DataFormatError, match=message) as e:
        read_beir_qrels(path)
    assert str(e.value).startswith(f"{path}, {where}: ")


def test_missing_files(tmp_path):
    for reader in (read_beir_corpus, read_beir_queries, read_beir_qrels, read_retrieval_results):
        with pytest.raises(FileNotFoundError, match="nope"):
            result = reader(tmp_path / "nope")
            list(result)


# --- DPR retrieval JSON -----------------------------------------------------------------


def records():
    return [
        {
            "question": "who got the first nobel prize in physics",
            "answers": ["Wilhelm Conrad Röntgen"],
            "ctxs": [
                {"id": "12", "title": "Röntgen", "text": "Wilhelm \"Conrad\"\nRöntgen won", "score": 81.5, "has_answer": True},
                {"id": "7", "title": "", "text": "other", "score": 80.0, "has_answer": False},
            ],
        },
        {"question": "q2", "answers": [], "ctxs": []},
    ]


def test_retrieval_json_round_trip_matches_json_dump(tmp_path):
    path = tmp_path / "out" / "retrieval.json"
    assert write_retrieval_results(path, iter(records())) == 2
    assert read_retrieval_results(path) == records()
    assert path.read_text(encoding="utf-8") == json.dumps(records(), indent=4, ensure_ascii=False) + "\n"


def test_retrieval_json_empty_and_numpy_scores(tmp_path):
    path = tmp_path / "r.json"
    assert write_retrieval_results(path, []) == 0
    assert read_retrieval_results(path) == []
    rec = {"question": "q", "answers": ["a"], "ctxs": [{"id": "1", "title": "", "text": "a", "score": np.float32(1.5), "has_answer": np.bool_(True)}]}
    write_retrieval_results(path, [rec])
    assert read_retrieval_results(path)[0]["ctxs"][0]["score"] == 1.5
    assert read_retrieval_results(path)[0]["ctxs"][0]["has_answer"] is True


def test_writer_streams_and_a_failure_leaves_no_file(tmp_path):
    path = tmp_path / "r.json"
    seen = []

    def gen():
        for r in records():
            seen.append(r["question"])
            yield r
        raise RuntimeError("retrieval died")

    with pytest.raises(RuntimeError):
        write_retrieval_results(path, gen())
    assert seen == ["who got the first nobel prize in physics", "q2"]
    assert not path.exists() and list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match="record 1"):
        write_retrieval_results(path, [records()[0], {"question": "no ctxs"}])
    assert not path.exists()


@pytest.mark.parametrize(
    "text, where, message",
    [
        ('[\n  {"question": "q",\n  "answers": [], "ctxs": []\n', "line 4, column 1", "invalid JSON"),
        ("", "line 1, column 1", "invalid JSON"),
        ('{"question": "q"}', "top level", "expected a JSON list"),
        ('[{"question": "q", "answers": [], "ctxs": []}, 3]', "record 1", "expected a JSON object"),
        ('[{"question": "q", "answers": []}]', "record 0", r"missing field\(s\) \['ctxs'\]"),
        ('[{"question": "q", "answers": "a", "ctxs": []}]', "record 0", "'answers' must be a list"),
        ('[{"question": "q", "answers": [], "ctxs": {}}]', "record 0", "'ctxs' must be a list"),
        ('[{"question": "q", "answers": [], "ctxs": [{"id": "1"}, {"text": "x"}]}]', "record 0, ctx 1", "'id'"),
    ],
)
def test_read_retrieval_errors(tmp_path, text, where, message):
    path = tmp_path / "bad.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(DataFormatError, match=message) as e:
        read_retrieval_results(path)
    assert str(e.value).startswith(f"{path}, {where}: ")
