"""PassageStore: random access by id into a passages TSV, exactly as `read_passages` reads it."""

import os
import pickle

import pytest

from taser.data.errors import DataFormatError
from taser.data.passage_store import PassageStore
from taser.data.passages import Passage, read_passages, write_passages

TRICKY = [
    Passage("3", 'He said "hi"\tand left', "Quotes"),  # csv-quoted: doubled quotes, a tab inside
    Passage("1", "line one\nline two", ""),  # a newline inside a quoted field, no title
    Passage("20", "naïve café 漢字", "Ünïcode"),
    Passage("2", "plain text", "Plain"),
]


def test_integer_ids_match_read_passages(tmp_path):
    tsv = tmp_path / "p.tsv"
    write_passages(tsv, TRICKY)
    store = PassageStore(tsv)
    assert store.integer_ids and len(store) == 4
    for p in read_passages(tsv):
        assert store[p.id] == p
    assert "20" in store and "007" not in store and "02" not in store and "x" not in store
    with pytest.raises(KeyError, match="'5' is not in"):
        store["5"]
    got = store.get_many(["20", "1", "20"])
    assert list(got) == ["1", "20"] and got["1"] == TRICKY[1]  # file order, deduplicated
    # "3" precedes "2" in the file but follows it in key (and request) order
    assert list(store.get_many(["2", "3", "2"])) == ["3", "2"]
    with pytest.raises(KeyError, match=r"1 passage ids are not in .*\['9'\]"):
        store.get_many(["1", "9"])
    assert sorted(store.ids(), key=int) == ["1", "2", "3", "20"]
    copy = pickle.loads(pickle.dumps(store))
    assert copy["3"] == TRICKY[0]
    store.close()


def test_string_ids(tmp_path):
    tsv = tmp_path / "p.tsv"
    passages = [Passage("wiki:10", "a"), Passage("007", "b", "t"), Passage("doc-é", "c"), Passage("9", "d")]
    write_passages(tsv, passages)
    with PassageStore(tsv) as store:
        assert not store.integer_ids
        assert [store[p.id] for p in passages] == passages
        assert "7" not in store and "wiki:1" not in store and "a-very-long-id-longer-than-any" not in store


def test_cache_is_reused_then_invalidated(tmp_path, monkeypatch):
    tsv, cache = tmp_path / "p.tsv", tmp_path / "cache" / "p.offsets.npz"
    write_passages(tsv, TRICKY)
    PassageStore(tsv, cache=cache).close()
    assert cache.is_file()
    with monkeypatch.context() as m:
        m.setattr(PassageStore, "_build", lambda self: pytest.fail("rebuilt despite a valid cache"))
        assert PassageStore(tsv, cache=cache)["20"] == TRICKY[2]
    write_passages(tsv, [*TRICKY, Passage("21", "new")])
    os.utime(tsv, ns=(1, 1))  # a different modification time, whatever the clock did
    assert PassageStore(tsv, cache=cache)["21"].text == "new"
    # same size, new content: only the modification time tells the cache is stale
    size = tsv.stat().st_size
    write_passages(tsv, [*TRICKY, Passage("22", "old")])
    os.utime(tsv, ns=(2, 2))
    assert tsv.stat().st_size == size
    with PassageStore(tsv, cache=cache) as store:
        assert store["22"].text == "old" and "21" not in store


def test_bad_input(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.tsv"):
        PassageStore(tmp_path / "missing.tsv")
    dup = tmp_path / "dup.tsv"
    write_passages(dup, [Passage("1", "a"), Passage("2", "b"), Passage("1", "c")])
    with pytest.raises(DataFormatError, match="passage id '1': appears more than once"):
        PassageStore(dup)
    bad = tmp_path / "bad.tsv"
    bad.write_text("id\ttext\ttitle\n1\tok\tt\n2\n")
    with pytest.raises(DataFormatError, match="line 3"):
        PassageStore(bad)
    header = tmp_path / "header.tsv"
    header.write_text("pid\tbody\n1\tx\n")
    with pytest.raises(DataFormatError, match="line 1"):
        PassageStore(header)
    empty = tmp_path / "empty.tsv"
    write_passages(empty, [])
    with pytest.raises(DataFormatError, match="no passages"):
        PassageStore(empty)
