"""Convert SQuAD JSON into DPR's formats, split by article.

Each article's paragraphs are joined and split into disjoint 100-word passages with the
article's title. A question's positive is the passage that holds a gold answer at its annotated character
offset (the first annotation that does not straddle two passages); a question with no such
annotation has no positive and is counted (`unmatched`). Answers for evaluation are all distinct gold answer texts.
"""

from __future__ import annotations

import json
import os
import random
import re
from dataclasses import dataclass, field
from pathlib import Path

from taser.data.biencoder_json import write_biencoder_json
from taser.data.errors import DataFormatError
from taser.data.passages import Passage, write_passages
from taser.data.qa import QAPair, write_qa
from taser.data.splitter import split_word_list
from taser.io import atomic_open
from taser.shipped import shipped_file

_WORD = re.compile(r"\S+")


@dataclass
class SquadQuestion:
    question: str
    answers: list[str]
    positive: int | None  # index into the corpus, None when the answer spans two passages


@dataclass
class SquadArticle:
    title: str
    passage_ids: list[int] = field(default_factory=list)
    questions: list[SquadQuestion] = field(default_factory=list)


def _word_index(spans: list[tuple[int, int]], char: int) -> int:
    """Index of the word covering `char`, or of the next word when `char` is whitespace."""
    lo, hi = 0, len(spans)
    while lo < hi:
        mid = (lo + hi) // 2
        if spans[mid][1] <= char:
            lo = mid + 1
        else:
            hi = mid
    return min(lo, len(spans) - 1)


def load_squad(path: str | os.PathLike, words_per_passage: int = 100) -> tuple[list[Passage], list[SquadArticle]]:
    """A SQuAD v1.1 JSON as (passages, articles): each article's text split into passages of
    `words_per_passage` words (DPR's 100); each article with its passages' indices into the list and its
    questions, each with its answers and the index of the passage holding its first answer."""
    try:
        with open(shipped_file(path), encoding="utf-8") as f:
            data = json.load(f)["data"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise DataFormatError(path, "top level", f"not a SQuAD JSON file with a 'data' list ({e})") from None
    corpus: list[Passage] = []
    articles: list[SquadArticle] = []
    for a, article in enumerate(data):
        title = article.get("title", "").replace("_", " ")
        words: list[str] = []
        located: list[tuple[str, list[str], list[tuple[int, int]]]] = []  # question, answers, word bounds
        for p, para in enumerate(article.get("paragraphs", [])):
            context = para["context"]
            spans = [m.span() for m in _WORD.finditer(context)]
            base = len(words)
            words.extend(context[s:e] for s, e in spans)
            for qa in para.get("qas", []):
                golds = qa.get("answers") or []
                if not golds:
                    raise DataFormatError(path, f"article {a}, paragraph {p}, question {qa.get('id')}", "no answers")
                bounds = []
                for g in golds:
                    start, end = g["answer_start"], g["answer_start"] + len(g["text"]) - 1
                    if context[start : end + 1] != g["text"]:
                        raise DataFormatError(
                            path, f"article {a}, paragraph {p}, question {qa.get('id')}", f"answer_start {start} does not point at {g['text']!r}"
                        )
                    bounds.append((base + _word_index(spans, start), base + _word_index(spans, end)))
                answers = list(dict.fromkeys(g["text"] for g in golds))
                located.append((qa["question"].strip(), answers, bounds))
        first = len(corpus)
        entry = SquadArticle(title)
        for block in split_word_list(words, words_per_passage):
            entry.passage_ids.append(len(corpus))
            corpus.append(Passage(str(len(corpus) + 1), block.text, title))
        for question, answers, bounds in located:
            # the first gold answer (in annotation order) that lies inside a single passage
            inside = [w0 // words_per_passage for w0, w1 in bounds if w0 // words_per_passage == w1 // words_per_passage]
            entry.questions.append(SquadQuestion(question, answers, first + inside[0] if inside else None))
        articles.append(entry)
    return corpus, articles


def _ctx(p: Passage) -> dict:
    return {"title": p.title, "text": p.text, "passage_id": p.id}


def _biencoder_records(corpus: list[Passage], articles: list[SquadArticle], negatives: int, rng: random.Random):
    for article in articles:
        for q in article.questions:
            if q.positive is None:
                continue
            others = [i for i in rng.sample(range(len(corpus)), min(len(corpus), negatives + 1)) if i != q.positive][:negatives]
            yield {
                "question": q.question,
                "answers": q.answers,
                "positive_ctxs": [_ctx(corpus[q.positive])],
                "negative_ctxs": [_ctx(corpus[i]) for i in others],
                "hard_negative_ctxs": [],
            }


def first_articles(squad_json: str | os.PathLike, n: int, out_path: str | os.PathLike) -> Path:
    """A SQuAD JSON of the first `n` articles of `squad_json`, written (atomically) at `out_path`."""
    with open(shipped_file(squad_json), encoding="utf-8") as f:
        data = json.load(f)
    total = len(data.get("data", []))
    if not 0 < n <= total:
        raise ValueError(f"{squad_json} holds {total} articles: cannot take the first {n}")
    with atomic_open(out_path) as f:
        json.dump({"version": data.get("version", "1.1"), "data": data["data"][:n]}, f)
    return Path(out_path)


def convert_squad(
    squad_json: str | os.PathLike,
    out_dir: str | os.PathLike,
    train_articles: int = 30,
    words_per_passage: int = 100,
    random_negatives: int = 10,
    seed: int = 0,
) -> dict:
    """Write passages.tsv, {train,dev}.json (bi-encoder), {train,dev}.qa.tsv and summary.json."""
    out = Path(out_dir)
    corpus, articles = load_squad(squad_json, words_per_passage)
    if not 0 < train_articles < len(articles):
        raise ValueError(f"train_articles must be in 1..{len(articles) - 1}, got {train_articles}")
    splits = {"train": articles[:train_articles], "dev": articles[train_articles:]}
    rng = random.Random(seed)
    summary = {"source": str(squad_json), "passages": write_passages(out / "passages.tsv", corpus)}
    for name, arts in splits.items():
        questions = [q for a in arts for q in a.questions]
        write_qa(out / f"{name}.qa.tsv", (QAPair(q.question, q.answers) for q in questions))
        matched = write_biencoder_json(out / f"{name}.json", _biencoder_records(corpus, arts, random_negatives, rng))
        summary[name] = {"articles": len(arts), "questions": len(questions), "with_positive": matched, "unmatched": len(questions) - matched}
    with atomic_open(out / "summary.json") as f:
        json.dump(summary, f, indent=2)
    return summary
