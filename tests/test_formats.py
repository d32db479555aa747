"""Round trips and bad input for DPR's formats: passages TSV, QA TSV, bi-encoder JSON."""

import json

import pytest
from conftest import FIXTURES

from taser.data.biencoder_json import BiEncoderJsonFile, write_biencoder_json
from taser.data.errors import DataFormatError
from taser.data.passages import Passage, read_passages, write_passages
from taser.data.qa import QAPair, read_qa, write_qa


def test_real_dpr_biencoder_sample_round_trip(tmp_path):
    src = FIXTURES / "biencoder-nq-dev-first5.json"
    original = json.loads(src.read_text())
    data = BiEncoderJsonFile(src)
    assert len(data) == 5
    assert [data[i] for i in range(5)] == original
    assert data[0]["question"] == original[0]["question"]
    assert sum(len(r["positive_ctxs"]) + len(r["negative_ctxs"]) + len(r["hard_negative_ctxs"]) for r in data) == 755
    out = tmp_path / "copy.json"
    assert write_biencoder_json(out, iter(data)) == 5
    assert json.loads(out.read_text()) == original
    assert list(BiEncoderJsonFile(out)) == original


def test_biencoder_json_handles_non_ascii_offsets(tmp_path):
    records = [
        {"question": f"q{i} é漢字", "answers": ["ü"], "positive_ctxs": [{"title": "Ω", "text": "naïve " * i}], "negative_ctxs": [], "hard_negative_ctxs": []}
        for i in range(50)
    ]
    path = tmp_path / "u.json"
    path.write_text(json.dumps(records, ensure_ascii=False, indent=3))
    data = BiEncoderJsonFile(path)
    assert data[49] == records[49] and data[7] == records[7]


@pytest.mark.parametrize(
    "content, message",
    [
        ('[{"question": "a", "positive_ctxs": [{"text": "x"}]}, {"question": "b", "positive_ctxs": [{"text": "y"}} ]', "record 1"),
        ('[{"answers": [], "positive_ctxs": [{"text": "x"}]}]', "missing or empty 'question'"),
        ('[{"question": "who?", "answers": [], "positive_ctxs": []}]', "has no positive_ctxs"),
        ('[{"question": "who?", "positive_ctxs": [{"title": "t"}]}]', "positive_ctxs[0]"),
        ('{"question": "who?"}', "expected a JSON list"),
        ('[{"question": "a", "positive_ctxs": [{"text": "x"}]} {"question": "b"}]', "expected ',' or ']'"),
        ('[{"question": "a", "positive_ctxs": [{"text": "x"}]}, ', "record 1"),
    ],
)
def test_biencoder_json_bad_input_names_file_and_record(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(DataFormatError) as e:
        BiEncoderJsonFile(path)
    assert str(path) in str(e.value) and message in str(e.value)


def test_biencoder_json_without_positives_allowed_for_mining(tmp_path):
    path = tmp_path / "q.json"
    path.write_text('[{"question": "who?", "answers": ["x"], "positive_ctxs": []}]')
    assert len(BiEncoderJsonFile(path, require_positive=False)) == 1


def test_passages_round_trip_with_quotes_and_tabs(tmp_path):
    passages = [Passage("1", 'He said "hi"\tthere', 'Title "Q"'), Passage("2", "plain", "")]
    path = tmp_path / "p.tsv"
    assert write_passages(path, passages) == 2
    assert path.read_text().splitlines()[0] == "id\ttext\ttitle"
    assert list(read_passages(path)) == passages


def test_passages_bad_input(tmp_path):
    path = tmp_path / "p.tsv"
    path.write_text("id\ttext\ttitle\n1\tgood\tT\n2\t \tT\n")
    with pytest.raises(DataFormatError, match=r"p.tsv, line 3: passage '2' has empty text"):
        list(read_passages(path))
    path.write_text("pid\tbody\n")
    with pytest.raises(DataFormatError, match="line 1: expected the header"):
        list(read_passages(path))
    with pytest.raises(FileNotFoundError, match="nope.tsv"):
        list(read_passages(tmp_path / "nope.tsv"))


def test_qa_round_trip_and_real_nq_file(tmp_path):
    pairs = [QAPair("who wrote 'x'?", ['A "B"', "c's"]), QAPair("when", ["1990"])]
    path = tmp_path / "qa.tsv"
    write_qa(path, pairs)
    assert list(read_qa(path)) == pairs
    nq = list(read_qa(FIXTURES / "nq-test.qa.tsv"))
    assert len(nq) == 3610 and all(q.answers for q in nq)


def test_qa_broken_answer_list_names_line(tmp_path):
    path = tmp_path / "qa.tsv"
    path.write_text("q1\t['a']\nq2\t['b', \n")
    with pytest.raises(DataFormatError, match=r"qa.tsv, line 2: answer list is not a Python list literal"):
        list(read_qa(path))
    path.write_text("q1\t__import__('os')\n")
    with pytest.raises(DataFormatError, match="line 1"):
        list(read_qa(path))


def test_writers_leave_no_half_written_file(tmp_path):
    path = tmp_path / "out.json"
    path.write_text("old complete content")

    def broken():
        yield {"question": "a", "positive_ctxs": [{"text": "x"}]}
        raise RuntimeError("killed mid-write")

    with pytest.raises(RuntimeError):
        write_biencoder_json(path, broken())
    assert path.read_text() == "old complete content"
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]
