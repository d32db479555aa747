"""The streaming reader of JSON arrays (retrieval JSON files too large for json.load): the same
elements as json.load, wherever the read blocks cut the text, errors at json.load's line and
column, and records handed out before the end of the file is read."""

import json

import pytest

from taser.data import json_stream
from taser.data.errors import DataFormatError
from taser.data.json_stream import iter_json_array
from taser.data.retrieval_json import iter_retrieval_results, write_retrieval_results

ELEMENTS = [
    {"question": "what is \"x\", [really]?", "answers": ["a, b", "]"], "ctxs": [{"id": "1", "text": "caf\u00e9 \u2013 \U0001f600", "score": 1.5e-3}]},
    12345678901234567890,
    -0.000125,
    "a string with \\n and \\\\ and \\u00e9",
    [],
    {},
    None,
    True,
    [[1, 2], {"k": [3, {"z": "]}"}]}],
]


@pytest.mark.parametrize("block", [1, 2, 3, 7, 64, 1 << 20])
def test_same_elements_as_json_load_wherever_blocks_cut(tmp_path, monkeypatch, block):
    monkeypatch.setattr(json_stream, "BLOCK", block)
    for indent in (None, 4):
        path = tmp_path / f"a{indent}.json"
        path.write_text(json.dumps(ELEMENTS, indent=indent, ensure_ascii=False), encoding="utf-8")
        assert list(iter_json_array(path)) == json.loads(path.read_text(encoding="utf-8"))
    for text, expected in (("[]", []), (" \n[ 1 ,2 ]\n ", [1, 2]), ("[3]", [3])):
        path.write_text(text)
        assert list(iter_json_array(path)) == expected


@pytest.mark.parametrize("block", [2, 5, 1 << 20])
@pytest.mark.parametrize(
    "text",
    ['[\n  {"question": "q",\n  "answers": [], "ctxs": []\n', '[1,\n 2,\n  {"a": tru}]', '[1 2]', '[1,]', "[", '[{"a": 1}]]', '[1]\n x'],
)
def test_errors_name_json_loads_line_and_column(tmp_path, monkeypatch, block, text):
    """Where json.load stops on the same text (its line and column), when it stops inside an element;
    every broken text is refused."""
    monkeypatch.setattr(json_stream, "BLOCK", block)
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(DataFormatError, match="invalid JSON") as raised:
        list(iter_json_array(path))
    try:
        json.loads(text)
    except json.JSONDecodeError as e:
        if text.startswith("[\n") or "tru}" in text:
            assert f"line {e.lineno}, column {e.colno}:" in str(raised.value)


def test_top_level_must_be_a_list(tmp_path):
    path = tmp_path / "x.json"
    for text, message in (("", "empty"), ('{"a": 1}', "got a JSON object"), ('"s"', "found '\"' first")):
        path.write_text(text)
        with pytest.raises(DataFormatError, match=message):
            list(iter_json_array(path))


def test_records_come_before_the_file_is_read_to_its_end(tmp_path, monkeypatch):
    """A stream: the first records are handed out (and may be dropped) before a broken tail is reached."""
    monkeypatch.setattr(json_stream, "BLOCK", 256)
    path = tmp_path / "r.json"
    records = [{"question": f"q{i}", "answers": ["a"], "ctxs": [{"id": str(i), "text": "t" * 50}]} for i in range(20)]
    write_retrieval_results(path, records)
    assert list(iter_retrieval_results(path)) == records
    path.write_text(path.read_text()[:-40])  # cut inside the last record
    stream = iter_retrieval_results(path)
    assert [next(stream) for _ in range(19)] == records[:19]
    with pytest.raises(DataFormatError, match="invalid JSON"):
        next(stream)
