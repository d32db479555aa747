"""Stage: retrieve top-k passages for a QA file (dense, BM25 or hybrid) and evaluate top-k accuracy.

`retrieve` is the one way every evaluation (QA files here, BEIR and EntityQuestions in
`taser.pipeline.evaluate_ood`) gets its ranked lists; every QA retriever ends in
`evaluate_retrieval`, so all write the same DPR retrieval JSON and a `results.json` naming the
task, dataset, retriever and its settings, with the top-k accuracy curve the report plots.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from taser.choice import Choice
from taser.data.config import HubData
from taser.data.qa import QAPair, read_qa
from taser.evaluation.retrieval_eval import evaluate_retrieval
from taser.evaluation.runs import system_name
from taser.retrieval.bm25 import BM25Settings
from taser.retrieval.hybrid import DPR_LAMBDA, HybridRule, fuse_many
from taser.retrieval.index_types import SearchSettings
from taser.training.provenance import training_provenance

# torch, transformers and faiss are imported only by the dense paths: BM25 alone starts fast.

log = logging.getLogger(__name__)


class Retriever(Choice):
    dense = "dense"
    bm25 = "bm25"
    hybrid = "hybrid"


@dataclass
class RetrieverSettings:
    """What retrieves, and how: the same for every task (QA file, BEIR, EntityQuestions)."""

    retriever: Retriever = Retriever.dense
    checkpoint: str | os.PathLike | None = None  # dense, hybrid
    index_dir: str | os.PathLike | None = None  # dense, hybrid; None: encode the passages into a flat index under the run's directory
    bm25: BM25Settings = field(default_factory=BM25Settings)  # bm25, hybrid (index_dir None: under the run's directory)
    lam: float = DPR_LAMBDA  # hybrid: bm25 + λ·dense
    rule: HybridRule = HybridRule.dpr
    candidates: int | None = None  # hybrid: each retriever's top-N fused (None: k)
    batch_size: int = 128
    precision: str = "auto"
    device: str = "auto"
    search: SearchSettings = field(default_factory=SearchSettings)  # dense, hybrid: ef_search, nprobe in place of the index's own
    backend: str = "torch"  # dense, hybrid: what runs the encoder (taser.models.backends)

    def __post_init__(self):
        self.retriever = Retriever.parse(self.retriever, "retriever")
        if isinstance(self.search, dict):
            self.search = SearchSettings(**self.search)
        self.rule = HybridRule.parse(self.rule, "hybrid rule")
        self.bm25 = BM25Settings.from_dict(self.bm25)
        if self.retriever != Retriever.bm25 and not self.checkpoint:
            raise ValueError(f"retriever={self.retriever} needs a checkpoint")


def _questions_per_s(questions: int, seconds: float) -> float:
    return round(questions / max(seconds, 1e-9), 2)


def dense_index(checkpoint, passages_tsv, work_dir, batch_size: int = 64, precision: str = "auto", device: str = "auto",
                backend: str = "torch", chunk_size: int = 10_000, shards: int = 1) -> Path:
    """A flat index of `checkpoint`'s passage vectors in `work_dir/index`, reused when it holds
    this checkpoint's vectors of this passages file by this backend, else encoded (resumably) and built.
    `shards` > 1: encoded by that many torchrun ranks of this machine, one shard (and GPU) each."""
    from taser.models.backends import backend_record, recorded_backend, resolve_backend, vectors_precision
    from taser.models.biencoder import read_checkpoint_config
    from taser.pipeline.encode import encode_corpus
    from taser.pipeline.index import build_index
    from taser.retrieval.embeddings import check_same_passages, checkpoint_identity, shard_dir
    from taser.retrieval.faiss_index import metric_for
    from taser.retrieval.index_types import IndexConfig
    from taser.runtime import pick_device

    work = Path(work_dir)
    index_dir, embeddings = work / "index", work / "embeddings"
    identity = checkpoint_identity(checkpoint)
    backend = resolve_backend(backend, pick_device(device).type)
    made_by = {**backend_record(backend), "precision": vectors_precision(backend, precision, pick_device(device))}

    def made_here(record: dict) -> bool:
        """Whether `record` (an index's or an embeddings manifest's) is of this checkpoint, passages file, backend (and its
        recipe) and precision."""
        try:
            check_same_passages(record.get("passages"), passages_tsv, str(work))
        except ValueError:
            return False
        return (record.get("passages") is not None and record.get("checkpoint") == identity
                and recorded_backend(record) == made_by)

    if (index_dir / "index.json").is_file() and made_here(json.loads((index_dir / "index.json").read_text())):
        log.info("reusing the flat index %s of %s", index_dir, checkpoint)
        shutil.rmtree(embeddings, ignore_errors=True)  # left by a kill between the index's save and their removal
        return index_dir
    manifest = shard_dir(embeddings, 0, shards) / "manifest.json"
    ours = {shard_dir(embeddings, i, shards).name for i in range(shards)}
    other_split = embeddings.is_dir() and any(p.name not in ours for p in embeddings.glob("shard_*"))
    if other_split or (manifest.is_file() and not made_here(json.loads(manifest.read_text()))):
        shutil.rmtree(embeddings)  # left by a killed run over another checkpoint, passages file or shard count: the stage's scratch
    if shards > 1:  # one shard per torchrun rank (GPU) of this machine (taser.pipeline.encode_worker)
        from taser.pipeline.process_tree import run_torchrun

        spec = {"checkpoint": str(checkpoint), "passages": str(passages_tsv), "out_dir": str(embeddings), "batch_size": batch_size,
                "precision": precision, "device": device, "backend": backend, "chunk_size": chunk_size}
        run_torchrun("taser.pipeline.encode_worker", spec, embeddings / "torchrun-spec.json", shards, "encoding the passages",
                     f"the last whole chunk of each shard in {embeddings}")
    else:
        encode_corpus(checkpoint, passages_tsv, embeddings, 0, 1, batch_size=batch_size, precision=precision, device=device, backend=backend,
                      chunk_size=chunk_size)
    similarity = read_checkpoint_config(checkpoint)[0].similarity
    build_index(embeddings, index_dir, IndexConfig("flat", metric_for(similarity)))
    shutil.rmtree(embeddings)
    return index_dir


def _dense_results(s: RetrieverSettings, passages_tsv, questions: list[str], k: int, work_dir) -> tuple[list, dict, float]:
    """(results, meta, seconds) of a checkpoint's dense retrieval."""
    from taser.models.encoding import encoding_runtime
    from taser.models.loading import load_checkpoint
    from taser.models.params import parameter_report
    from taser.retrieval.dense import dense_retrieve
    from taser.retrieval.embeddings import check_same_passages
    from taser.retrieval.faiss_index import load_index

    index_dir = s.index_dir or dense_index(s.checkpoint, passages_tsv, Path(work_dir) / "dense-index", min(s.batch_size, 64), s.precision, s.device,
                                           s.backend)
    model, tokenizer = load_checkpoint(s.checkpoint, s.device, s.backend)
    runtime = encoding_runtime(model, s.precision)
    index = load_index(index_dir, s.search)
    check_same_passages(index.meta.get("passages"), passages_tsv, f"the index {index_dir}")
    start = time.perf_counter()
    retrieved = dense_retrieve(model, tokenizer, index, questions, k, s.batch_size, runtime["precision"])
    seconds = time.perf_counter() - start
    meta = {
        "model": str(s.checkpoint),
        **training_provenance(s.checkpoint),
        "index": str(index_dir),
        **({"search": s.search.given()} if s.search.given() else {}),
        "model_type": model.config.model_type,
        "pretrained": model.config.pretrained,
        "parameters": parameter_report(model)["total"],
        **runtime,
    }
    return retrieved, meta, seconds


def _bm25_results(s: RetrieverSettings, passages_tsv, questions: list[str], k: int, work_dir) -> tuple[list, dict, float]:
    """(results, meta, seconds) of BM25 retrieval; the index is built once, then reused."""
    index = s.bm25.open(passages_tsv, Path(work_dir) / "bm25-index")
    try:
        start = time.perf_counter()
        retrieved = index.batch_search(questions, k, s.bm25.threads)
        seconds = time.perf_counter() - start
    finally:
        index.close()
    return retrieved, s.bm25.describe(index), seconds


def retrieve(settings: RetrieverSettings, questions: list[str], passages_tsv, k: int, work_dir) -> tuple[list[list[tuple[str, float]]], dict]:
    """Per question, the top-k (passage id, score) pairs, best first; and what retrieved them
    (the `results.json` fields: retriever, model, parameters, BM25 settings, questions/s).

    `work_dir` holds what the retriever builds when not told where: the flat index of a
    checkpoint without `index_dir` (`work_dir/dense-index`), a BM25 index without
    `bm25.index_dir` (`work_dir/bm25-index`).
    """
    s = settings
    if s.retriever == Retriever.dense:
        retrieved, meta, seconds = _dense_results(s, passages_tsv, questions, k, work_dir)
        return retrieved, {"retriever": "dense", **meta, "questions_per_s": _questions_per_s(len(questions), seconds)}
    if s.retriever == Retriever.bm25:
        retrieved, meta, seconds = _bm25_results(s, passages_tsv, questions, k, work_dir)
        return retrieved, {"retriever": "bm25", "seed": None, "bm25": meta, "questions_per_s": _questions_per_s(len(questions), seconds)}
    n = s.candidates or k
    dense, dense_meta, dense_seconds = _dense_results(s, passages_tsv, questions, n, work_dir)
    sparse, bm25_meta, bm25_seconds = _bm25_results(s, passages_tsv, questions, n, work_dir)
    start = time.perf_counter()
    fused = fuse_many(sparse, dense, s.lam, s.rule, k)
    seconds = dense_seconds + bm25_seconds + time.perf_counter() - start
    return fused, {"retriever": "hybrid", "rule": str(s.rule), "lambda": s.lam, "candidates": n, **dense_meta, "bm25": bm25_meta,
                   "questions_per_s": _questions_per_s(len(questions), seconds)}


def qa_dataset_name(qa_file: str | os.PathLike) -> str:
    """A QA file's dataset name for reports: its file name without `.qa`, `.csv`, `.tsv` (`nq-test`)."""
    name = Path(qa_file).name
    for suffix in (".tsv", ".csv", ".qa"):
        name = name.removesuffix(suffix)
    return name


def with_system(head: dict, meta: dict) -> dict:
    """`results.json`'s leading fields: the task's `head`, the retriever's `meta` (with the checkpoint's
    training seed), and `system`, the name the report groups the runs of one system by (over seeds)."""
    fields = {**head, **meta}
    return {**fields, "system": system_name(fields)}


def evaluate_qa(settings: RetrieverSettings, qa_file, passages_tsv, out_dir, k: int = 100, match: str = "string",
                dataset: str | None = None, name: str | None = None, qa: list[QAPair] | None = None) -> dict:
    """Top-k accuracy of `settings`' retriever on a QA file (or on the questions `qa`, named `qa_file`);
    writes `out_dir/retrieval.json` and `results.json`."""
    qa = list(read_qa(qa_file)) if qa is None else qa
    retrieved, meta = retrieve(settings, [q.question for q in qa], passages_tsv, k, out_dir)
    head = {"task": "qa", "dataset": dataset or qa_dataset_name(qa_file), **({"name": name} if name else {})}
    results = evaluate_retrieval(qa, retrieved, passages_tsv, out_dir, match, meta=with_system(head, meta))
    log.info("%s (%s): %s", qa_file, meta["retriever"], results["summary"])
    return results


def evaluate_qa_hub(settings: RetrieverSettings, hub: HubData, out_dir, k: int = 100, match: str = "string",
                    dataset: str | None = None, name: str | None = None) -> dict:
    """`evaluate_qa` on a hub question set (`hub.qa`, its question and answers columns) over a hub
    corpus (`hub.passages`, written once as a passages TSV under `hub.work_dir`)."""
    from taser.data.hub_qa import hub_passages_tsv, load_questions

    qa = load_questions(hub.qa, hub.question_column, hub.answers_column, hub.cache_dir)
    passages_tsv = hub_passages_tsv(hub.passages, hub.work_dir, hub.id_column, hub.cache_dir)
    default_name = "-".join(filter(None, (hub.qa.name.rstrip("/").rsplit("/", 1)[-1], hub.qa.config, hub.qa.split)))
    return evaluate_qa(settings, str(hub.qa), passages_tsv, out_dir, k, match, dataset or default_name, name, qa=qa)


def evaluate_dense(
    checkpoint: str | os.PathLike,
    index_dir: str | os.PathLike | None,
    qa_file: str | os.PathLike,
    passages_tsv: str | os.PathLike,
    out_dir: str | os.PathLike,
    k: int = 100,
    match: str = "string",
    batch_size: int = 128,
    precision: str = "auto",
    device: str = "auto",
    dataset: str | None = None,
    name: str | None = None,
) -> dict:
    """A checkpoint's top-k accuracy; `index_dir` None: a flat index built under `out_dir`."""
    settings = RetrieverSettings("dense", checkpoint, index_dir, batch_size=batch_size, precision=precision, device=device)
    return evaluate_qa(settings, qa_file, passages_tsv, out_dir, k, match, dataset, name)


def evaluate_bm25(
    qa_file: str | os.PathLike,
    passages_tsv: str | os.PathLike,
    out_dir: str | os.PathLike,
    k: int = 100,
    match: str = "string",
    bm25: BM25Settings | dict | None = None,
    dataset: str | None = None,
    name: str | None = None,
) -> dict:
    """BM25's top-k accuracy. `bm25`: backend, k1, b, index_dir (default `<out_dir>/bm25-index`), threads."""
    settings = RetrieverSettings("bm25", bm25=BM25Settings.from_dict(bm25))
    return evaluate_qa(settings, qa_file, passages_tsv, out_dir, k, match, dataset, name)


def evaluate_hybrid(
    checkpoint: str | os.PathLike,
    index_dir: str | os.PathLike | None,
    qa_file: str | os.PathLike,
    passages_tsv: str | os.PathLike,
    out_dir: str | os.PathLike,
    k: int = 100,
    match: str = "string",
    bm25: BM25Settings | dict | None = None,
    lam: float = DPR_LAMBDA,
    rule: str = "dpr",
    candidates: int | None = None,
    batch_size: int = 128,
    precision: str = "auto",
    device: str = "auto",
    dataset: str | None = None,
    name: str | None = None,
) -> dict:
    """Top-k accuracy of BM25 fused with a dense checkpoint (`taser.retrieval.hybrid`).

    Each retriever returns its top-`candidates` (default k); their union is reranked by `rule`
    with weight `lam` on the dense score, and the first k are judged.
    """
    settings = RetrieverSettings("hybrid", checkpoint, index_dir, BM25Settings.from_dict(bm25), lam, rule, candidates, batch_size, precision, device)
    return evaluate_qa(settings, qa_file, passages_tsv, out_dir, k, match, dataset, name)


def with_bm25_dir(settings: RetrieverSettings, index_dir: str | os.PathLike) -> RetrieverSettings:
    """`settings` with BM25's index in `index_dir` unless one was given."""
    if settings.bm25.index_dir:
        return settings
    return replace(settings, bm25=replace(settings.bm25, index_dir=str(index_dir)))
