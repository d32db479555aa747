"""BEIR datasets on the hub (`taser.data.hub`): `BeIR/<name>` with its configs `corpus` (split
`corpus`) and `queries` (split `queries`), and `BeIR/<name>-qrels` with a split per qrels file
(`query-id`, `corpus-id`, `score`). Read with the rules of BEIR's files (`taser.data.beir`): ids
as strings, the queries a split's qrels judge, a document without text kept by its title.

`name` may also be a local mirror: a directory with `corpus/` and `queries/` (each a save_to_disk
directory or JSON data files named after the split), beside `<name>-qrels/`.
"""

from __future__ import annotations

from dataclasses import dataclass

from taser.data.beir import beir_documents, beir_queries, judged_queries
from taser.data.errors import DataFormatError
from taser.data.hub import HubSplit, load_split, require_columns

QRELS_COLUMNS = ["query-id", "corpus-id", "score"]


@dataclass
class HubBeir:
    corpus: object  # datasets.Dataset: _id, title, text
    queries: dict[str, str]  # the judged queries, in the qrels' order
    qrels: dict[str, dict[str, int]]
    corpus_spec: HubSplit
    name: str  # the dataset's name for reports (`scifact` of BeIR/scifact)


def beir_hub_splits(name: str, split: str = "test") -> tuple[HubSplit, HubSplit, HubSplit]:
    """(corpus, queries, qrels) of a BEIR dataset on the hub."""
    base = name.rstrip("/")
    return HubSplit(base, "corpus", "corpus"), HubSplit(base, "queries", "queries"), HubSplit(f"{base}-qrels", None, split)


def _id(value, where: str, at: str) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str) or not value.strip():
        raise DataFormatError(where, at, f"an id must be a non-empty string, got {value!r}")
    return value.strip()


def hub_qrels(dataset, where: str) -> dict[str, dict[str, int]]:
    """{query id: {corpus id: score}} of a qrels split, checked as `read_beir_qrels` checks a qrels TSV."""
    require_columns(dataset, where, QRELS_COLUMNS, "BEIR qrels")
    qrels: dict[str, dict[str, int]] = {}
    for i, row in enumerate(dataset.select_columns(QRELS_COLUMNS)):
        at = f"record {i}"
        qid, docid, score = _id(row["query-id"], where, at), _id(row["corpus-id"], where, at), row["score"]
        if isinstance(score, float) and score.is_integer():
            score = int(score)
        if not isinstance(score, int) or isinstance(score, bool):
            raise DataFormatError(where, at, f"score must be an integer, got {score!r}")
        judged = qrels.setdefault(qid, {})
        if judged.get(docid, score) != score:
            raise DataFormatError(where, at, f"conflicting scores for ({qid!r}, {docid!r}): {judged[docid]} and {score}")
        judged[docid] = score
    if not qrels:
        raise DataFormatError(where, "top level", "no judgements")
    return qrels


def load_beir_hub(name: str, split: str = "test", cache_dir=None) -> HubBeir:
    corpus_spec, queries_spec, qrels_spec = beir_hub_splits(name, split)
    qrels = hub_qrels(load_split(qrels_spec, cache_dir), str(qrels_spec))
    queries_ds = load_split(queries_spec, cache_dir)
    all_queries = beir_queries(((f"record {i}", row) for i, row in enumerate(queries_ds)), str(queries_spec))
    queries, qrels = judged_queries(qrels, all_queries, str(qrels_spec), str(queries_spec))
    corpus = load_split(corpus_spec, cache_dir)
    require_columns(corpus, str(corpus_spec), ["_id", "text"], "a BEIR corpus")
    return HubBeir(corpus, queries, qrels, corpus_spec, name.rstrip("/").rsplit("/", 1)[-1])


def hub_beir_passages(beir: HubBeir, stats: dict | None = None):
    """The corpus as passages (`beir_documents`' rules)."""
    rows = ((f"record {i}", row) for i, row in enumerate(beir.corpus))
    return beir_documents(rows, str(beir.corpus_spec), stats)
