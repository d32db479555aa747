"""The GPU check's data: the shipped SQuAD file converted by `convert_squad` (training questions
with their positives and negatives), and its passages and questions to encode, repeated up to the
counts asked for."""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path

from taser.data.passages import read_passages
from taser.data.qa import read_qa
from taser.data.squad import convert_squad, first_articles
from taser.shipped import shipped_file


@dataclass
class CheckData:
    train_file: str  # bi-encoder JSON (DPR's format)
    passages: list  # Passage objects, repeated up to the count asked for
    questions: list[str]
    corpus_passages: int  # distinct passages before repeating
    corpus_questions: int


def _first(items: list, n: int) -> list:
    """`n` items: `items` repeated as often as needed, cut at `n`."""
    if not items:
        raise ValueError("nothing to encode: the converted SQuAD data has no passages or questions")
    return list(itertools.islice(itertools.cycle(items), n))


def prepare_data(squad_json: str | Path, work: Path, passages: int, questions: int, articles: int | None = None, seed: int = 0) -> CheckData:
    """Convert `squad_json` (its first `articles` articles, all but the last one training) under `work`/data."""
    source = shipped_file(squad_json)
    data = json.loads(source.read_text(encoding="utf-8"))
    total = len(data["data"])
    n = total if articles is None else min(articles, total)
    if n < 2:
        raise ValueError(f"{source} holds {total} article(s): the GPU check needs at least 2 (one to train from, one held out)")
    if n < total:
        source = first_articles(source, n, work / f"squad-first-{n}.json")
    out = work / "data"
    convert_squad(source, out, train_articles=n - 1, seed=seed)
    corpus = list(read_passages(out / "passages.tsv"))
    asked = [pair.question for split in ("train", "dev") for pair in read_qa(out / f"{split}.qa.tsv")]
    return CheckData(str(out / "train.json"), _first(corpus, passages), _first(asked, questions), len(corpus), len(asked))
