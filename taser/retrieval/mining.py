"""Hard-negative mining, and distant supervision for questions without a gold passage.

For each question a retriever (BM25, a dense model, or a retrieval already made) returns its top-N passages. Then:

- hard negatives: the highest-ranked passages that contain no answer (`has_answer` on the
  passage text, string or regex match) and are not a positive (same `passage_id` when the
  positive has one, else the same text); at most `num_hard_negatives`, best first, each
  `{"title", "text", "score", "passage_id"}`. They replace the record's `hard_negative_ctxs`;
  every other field is kept.
- distant supervision (how DPR built its TriviaQA, WebQuestions and CuratedTREC data): a
  question with no `positive_ctxs` gets the highest-ranked retrieved passage that contains an
  answer as its positive; a question with none in its top-N is dropped and counted. With
  `distant_positives`, every question is treated so, its given positives set aside (DPR's
  Table 5: distant against gold supervision on the same questions).

Input is a DPR bi-encoder JSON (usually with positives) or a QA TSV (question and answers
only). Questions are processed in blocks: one batched search per block, the block's passages
fetched from a `PassageStore`, records streamed to the output. Memory is bounded by one block,
whatever the number of questions or the size of the corpus. The output is a new file written
atomically; a summary is returned and written beside it as `<output stem>.summary.json`.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from taser.data.biencoder_json import BiEncoderJsonFile, write_biencoder_json
from taser.data.config import Match
from taser.data.passages import Passage, same_passage
from taser.data.qa import read_qa
from taser.evaluation.answers import has_answer
from taser.io import atomic_open
from taser.progress import progress as progress_bar

log = logging.getLogger(__name__)

Hit = tuple[str, float]
# A retriever: questions and k -> per question, (passage id, score) pairs, best first.
Searcher = Callable[[Sequence[str], int], list[list[Hit]]]


def bm25_searcher(index, threads: int | None = None) -> Searcher:
    """Batched BM25 search with a `BM25Index`."""
    return lambda questions, k: index.batch_search(list(questions), k, threads, progress=False)


def dense_searcher(model, tokenizer, index, batch_size: int = 128, precision: str = "auto") -> Searcher:
    """Batched dense search: encode questions with `model`, search a `PassageIndex`."""
    from taser.retrieval.dense import dense_retrieve

    return lambda questions, k: dense_retrieve(model, tokenizer, index, questions, k, batch_size, precision, progress=False)


def retrieval_searcher(path: str | os.PathLike, retrieved_k: int) -> Searcher:
    """The rankings of a retrieval already made, the top `retrieved_k` of each question (DPR's
    retrieval JSON, `taser.data.retrieval_json`: a table's `retrieve-train` stage), as a `Searcher`:
    its records are read once, in order, and must be the mined file's questions in the same order."""
    from taser.data.retrieval_json import iter_retrieval_results

    records = enumerate(iter_retrieval_results(path))

    def search(questions: Sequence[str], k: int) -> list[list[Hit]]:
        if k > retrieved_k:
            raise ValueError(f"{path} holds the top {retrieved_k} passages of each question; mining reads the first {k}")
        ranked = []
        for question in questions:
            i, record = next(records, (None, None))
            if record is None:
                raise ValueError(f"{path} ends before the question {question!r}: it holds fewer questions than the file mined")
            if record["question"].strip() != question.strip():  # a QA file's round trip strips questions
                raise ValueError(f"{path}, record {i}: question {record['question']!r}, but the file mined has {question!r} there "
                                 "(a retrieval of other questions, or in another order)")
            ranked.append([(str(c["id"]), float(c["score"])) for c in record["ctxs"][:k]])
        return ranked

    return search


def _ctx(p: Passage, score: float) -> dict:
    return {"title": p.title, "text": p.text, "score": float(score), "passage_id": p.id}


def _is_positive(pid: str, text: str, positives: list[dict]) -> bool:
    return any(same_passage({"passage_id": pid, "text": text}, ctx) for ctx in positives)


def mine_record(record: dict, ranked: Sequence[Hit], passages: Mapping[str, Passage],
                num_hard_negatives: int = 30, match: str = "string", distant_positives: bool = False) -> dict | None:
    """`record` with mined `hard_negative_ctxs` (and a distant positive when it had none, or always
    with `distant_positives`: its given positives replaced by the distant one).

    `ranked` is the question's retrieved (passage id, score) list, best first; `passages`
    maps those ids to passages. None when the record has no positive and none was found.
    """
    answers = record.get("answers") or []
    positives = [] if distant_positives else list(record.get("positive_ctxs") or [])
    out = dict(record)
    # One walk down the ranking. Hard negatives are the first `num_hard_negatives` passages
    # that hold no answer and are not a positive. A distant positive (the first passage holding
    # an answer) is only known once reached, so until then every answer-free passage is kept
    # as a candidate and checked against it when it is found.
    candidates: list[tuple[str, Passage, float]] = []  # answer-free, not a positive, best first
    answer_of: dict[str, bool] = {}  # has_answer per passage id: computed at most once
    for pid, score in ranked:
        if positives and len(candidates) >= num_hard_negatives:
            break
        p = passages[pid]
        if positives and _is_positive(pid, p.text, positives):
            continue
        if pid not in answer_of:
            answer_of[pid] = has_answer(answers, p.text, match)
        if not answer_of[pid]:
            candidates.append((pid, p, score))
        elif not positives:
            positives = [_ctx(p, score)]
            out["positive_ctxs"] = positives
            candidates = [c for c in candidates if not _is_positive(c[0], c[1].text, positives)]
    if not positives:
        return None
    negatives = [_ctx(p, score) for _, p, score in candidates[: max(num_hard_negatives, 0)]]
    out["hard_negative_ctxs"] = negatives
    return out


@dataclass
class MiningStats:
    questions: int = 0
    written: int = 0
    dropped_no_positive: int = 0
    distant_positives: int = 0
    hard_negatives: int = 0
    fewer_than_requested: int = 0


def read_questions(path: str | os.PathLike) -> tuple[int | None, Iterator[dict]]:
    """(count, records) of a bi-encoder JSON (`.json`) or a QA TSV (anything else).

    A QA TSV is streamed in one pass; its count is its number of non-empty lines (one raw read,
    no parsing), which is the number of questions unless a quoted field spans lines: it only
    sizes the progress bar.
    """
    if str(path).endswith(".json"):
        data = BiEncoderJsonFile(path, require_positive=False)
        return len(data), iter(data)
    records = ({"question": qa.question, "answers": qa.answers, "positive_ctxs": [], "negative_ctxs": [],
                "hard_negative_ctxs": []} for qa in read_qa(path))
    if not Path(path).is_file():
        return None, records  # read_qa says what is wrong
    with open(path, "rb") as f:
        lines = sum(1 for line in f if line.strip())
    return lines, records


def summary_path(output: str | os.PathLike) -> Path:
    out = Path(output)
    stem = out.name[: -len(".json")] if out.name.endswith(".json") else out.name
    return out.with_name(f"{stem}.summary.json")


def mine_hard_negatives(
    input_path: str | os.PathLike,
    output_path: str | os.PathLike,
    search: Searcher,
    passages,
    top_n: int = 100,
    num_hard_negatives: int = 30,
    match: str = "string",
    block_size: int = 1000,
    progress: bool = True,
    meta: dict | None = None,
    distant_positives: bool = False,
) -> dict:
    """Mine hard negatives for every question of `input_path` into `output_path` (see the module notes).

    `search` is a `Searcher` (see `bm25_searcher`, `dense_searcher`); `passages` is a
    `PassageStore` over the corpus the retriever searches (anything with `get_many`).
    `meta` (the retriever's settings) goes into the summary, which is returned.
    """
    if Path(input_path).resolve() == Path(output_path).resolve():
        raise ValueError(f"the output must be a new file, not the input {input_path}")
    if top_n < 1 or num_hard_negatives < 0 or block_size < 1:
        raise ValueError(f"need top_n >= 1, num_hard_negatives >= 0, block_size >= 1; got {top_n}, {num_hard_negatives}, {block_size}")
    Match.parse(match, "answer match mode")
    start = time.perf_counter()
    total, records = read_questions(input_path)
    stats = MiningStats()
    bar = progress_bar(total=total, desc="mine negatives", unit="question", enabled=progress)

    def mined() -> Iterator[dict]:
        while block := list(itertools.islice(records, block_size)):
            ranked = search([r["question"] for r in block], top_n)
            found = passages.get_many(pid for hits in ranked for pid, _ in hits)
            for record, hits in zip(block, ranked):
                stats.questions += 1
                out = mine_record(record, hits, found, num_hard_negatives, match, distant_positives)
                if out is None:
                    stats.dropped_no_positive += 1
                    continue
                stats.written += 1
                stats.distant_positives += distant_positives or not record.get("positive_ctxs")
                stats.hard_negatives += len(out["hard_negative_ctxs"])
                stats.fewer_than_requested += len(out["hard_negative_ctxs"]) < num_hard_negatives
                yield out
            bar.update(len(block))

    try:
        write_biencoder_json(output_path, mined())
    finally:
        bar.close()
    seconds = time.perf_counter() - start
    summary = {
        "input": str(input_path),
        "output": str(output_path),
        **(meta or {}),
        "top_n": top_n,
        "num_hard_negatives": num_hard_negatives,
        "match": match,
        "positives": "distant" if distant_positives else "given (distant where none)",
        "questions": stats.questions,
        "written": stats.written,
        "dropped_no_positive": stats.dropped_no_positive,
        "distant_positives": stats.distant_positives,
        "mean_hard_negatives": round(stats.hard_negatives / max(stats.written, 1), 2),
        "fewer_than_requested": stats.fewer_than_requested,
        "seconds": round(seconds, 1),
        "questions_per_s": round(stats.questions / max(seconds, 1e-9), 1),
    }
    with atomic_open(summary_path(output_path)) as f:
        json.dump(summary, f, indent=2)
    log.info("mined %s: %d of %d questions written (%d dropped: no positive in the top-%d, %d distant positives), "
             "%.1f hard negatives per question, %.0f questions/s", output_path, stats.written, stats.questions,
             stats.dropped_no_positive, top_n, stats.distant_positives, summary["mean_hard_negatives"],
             summary["questions_per_s"])
    return summary
