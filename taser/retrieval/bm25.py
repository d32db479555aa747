"""BM25 over a DPR passages TSV: one interface, two backends.

- `pyserini` (default): Lucene through Anserini, English analyzer with Porter stemming. Needs
  Java 21+ (see `taser.retrieval.java`).
- `bm25s`: in-process, no Java. Text goes through `english_terms`, an analyzer close to
  Lucene's English one, and scores use Lucene's BM25 variant with the same k1 and b.

Each passage is indexed as "title\\ntext" under its passage id. An index is a directory holding
`bm25.json` (backend, k1, b, passage count, source TSV) and the backend's files; it is built in
a temporary directory and renamed, so a directory with `bm25.json` is always complete. Searches
return `(passage_id, score)` pairs, best first; BM25 only returns passages sharing a term with
the query, so there may be fewer than k hits, or none. `BM25Settings` is what the stages
(evaluation, mining, the demo) take: backend, k1, b and where the index lives.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from taser.choice import Choice, settings_from
from taser.data.errors import DataFormatError
from taser.data.passages import Passage, read_passages
from taser.io import atomic_dir, atomic_open
from taser.progress import on_terminal
from taser.progress import progress as progress_bar
from taser.retrieval.english import ANALYZER, english_terms

log = logging.getLogger(__name__)

class BM25Backend(Choice):
    pyserini = "pyserini"  # Lucene through pyserini (Java)
    bm25s = "bm25s"  # in-process


BACKENDS = BM25Backend.names()
META_FILE = "bm25.json"
FORMAT_VERSION = 1
Hit = tuple[str, float]
PathLike = str | os.PathLike
SEARCH_BLOCK = 1000  # queries per batched search under a progress bar


def default_threads() -> int:
    """Threads for indexing and batch search: the CPUs this process may use, at most 8."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(8, cpus))


def passage_contents(p: Passage) -> str:
    """What BM25 indexes for a passage: its title and text."""
    return f"{p.title}\n{p.text}" if p.title else p.text


# ---------------------------------------------------------------------------------------------
# Backends. Each builds into a directory, counts the passages, and loads for search.


class _LuceneBackend:
    """Lucene BM25 via Anserini: indexed by a Java subprocess, searched through pyserini."""

    subdir = "lucene"

    @staticmethod
    def build(passages: Iterable[Passage], out: Path, k1: float, b: float, threads: int) -> int:
        from taser.retrieval.java import java_command

        docs = out / "_docs"
        docs.mkdir()
        shards: list = []
        n = 0
        try:
            for p in passages:  # round-robin shards: Anserini indexes one file per thread
                if len(shards) < threads:
                    shards.append(open(docs / f"part-{len(shards):03d}.jsonl", "w", encoding="utf-8"))
                shards[n % threads].write(json.dumps({"id": p.id, "contents": passage_contents(p)}) + "\n")
                n += 1
        finally:
            for f in shards:
                f.close()
        if n == 0:
            return 0
        cmd = java_command(
            "io.anserini.index.IndexCollection", "-collection", "JsonCollection",
            "-generator", "DefaultLuceneDocumentGenerator", "-input", str(docs),
            "-index", str(out / _LuceneBackend.subdir), "-threads", str(threads),
        )
        log_path = out / "lucene-index.log"
        log.info("BM25 (pyserini): Lucene indexes %d passages with %d threads (its log: %s)", n, threads, log_path)
        with open(log_path, "w", encoding="utf-8") as f:  # Anserini logs to stdout: keep it here
            rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode
        for shard in docs.iterdir():
            shard.unlink()
        docs.rmdir()
        text = log_path.read_text(encoding="utf-8", errors="replace")
        if rc != 0:
            raise RuntimeError(f"Lucene indexing failed (exit {rc}): {' '.join(cmd)}\n{text[-3000:]}")
        m = re.search(r"^.*indexed:\s+(\d+)\s*$", text, re.M)
        if m and int(m.group(1)) != n:
            raise RuntimeError(f"Lucene indexed {m.group(1)} of {n} passages; see the log:\n{text[-3000:]}")
        return n

    def __init__(self, index_dir: Path, k1: float, b: float):
        from taser.retrieval.java import ensure_pyserini

        self._searcher = ensure_pyserini().LuceneSearcher(str(index_dir / self.subdir))
        self._searcher.set_bm25(k1, b)

    def search(self, query: str, k: int) -> list[Hit]:
        return [(h.docid, float(h.score)) for h in self._searcher.search(query, k)]

    def batch_search(self, queries: Sequence[str], k: int, threads: int) -> list[list[Hit]]:
        qids = [str(i) for i in range(len(queries))]
        found = self._searcher.batch_search(list(queries), qids, k, threads)
        return [[(h.docid, float(h.score)) for h in found.get(q, [])] for q in qids]

    def close(self) -> None:
        self._searcher.close()


def _import_bm25s():
    """bm25s, with its logger (set to DEBUG by the package) back to WARNING."""
    import bm25s

    logging.getLogger("bm25s").setLevel(logging.WARNING)
    return bm25s


class _BM25SBackend:
    """bm25s (numpy, in-process) over `english_terms`, Lucene's BM25 variant."""

    subdir = "bm25s"
    ids_file = "passage_ids.json"

    @staticmethod
    def build(passages: Iterable[Passage], out: Path, k1: float, b: float, threads: int) -> int:
        bm25s = _import_bm25s()
        vocab: dict[str, int] = {}
        corpus: list[list[int]] = []
        ids: list[str] = []
        for p in passages:
            corpus.append([vocab.setdefault(t, len(vocab)) for t in english_terms(passage_contents(p))])
            ids.append(p.id)
        if not ids:
            return 0
        retriever = bm25s.BM25(k1=k1, b=b, method="lucene")
        retriever.index((corpus, vocab), show_progress=on_terminal())
        retriever.save(str(out / _BM25SBackend.subdir), show_progress=False)
        with open(out / _BM25SBackend.subdir / _BM25SBackend.ids_file, "w", encoding="utf-8") as f:
            json.dump(ids, f)
        return len(ids)

    def __init__(self, index_dir: Path, k1: float, b: float):
        bm25s = _import_bm25s()
        folder = index_dir / self.subdir
        self._retriever = bm25s.BM25.load(str(folder), show_progress=False)
        with open(folder / self.ids_file, encoding="utf-8") as f:
            self._ids: list[str] = json.load(f)

    def _term_ids(self, query: str) -> list[int]:
        vocab = self._retriever.vocab_dict
        return [vocab[t] for t in english_terms(query) if t in vocab]

    def search(self, query: str, k: int) -> list[Hit]:
        return self.batch_search([query], k, threads=0)[0]

    def batch_search(self, queries: Sequence[str], k: int, threads: int) -> list[list[Hit]]:
        results: list[list[Hit]] = [[] for _ in queries]
        term_ids = [self._term_ids(q) for q in queries]
        asked = [i for i, t in enumerate(term_ids) if t]  # no known term: no hit
        k = min(k, len(self._ids))
        if not asked or k <= 0:
            return results
        docs, scores = self._retriever.retrieve(
            [term_ids[i] for i in asked], k=k, show_progress=False, n_threads=threads if threads > 1 else 0
        )
        for i, row_docs, row_scores in zip(asked, docs.tolist(), scores.tolist()):
            results[i] = [(self._ids[d], s) for d, s in zip(row_docs, row_scores) if s > 0]
        return results

    def close(self) -> None:
        pass


_BACKEND_CLASSES = {"pyserini": _LuceneBackend, "bm25s": _BM25SBackend}


# ---------------------------------------------------------------------------------------------


def _read_meta(path: Path) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _source_stamp(passages_tsv: PathLike) -> dict:
    path = Path(passages_tsv).resolve()
    st = path.stat()
    return {"path": str(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


class BM25Index:
    """A BM25 index over a passages TSV, on disk; search with `search` / `batch_search`."""

    def __init__(self, index_dir: str | os.PathLike, meta: dict):
        self.index_dir = Path(index_dir)
        self.meta = meta
        self.backend: str = meta["backend"]
        self.k1: float = meta["k1"]
        self.b: float = meta["b"]
        self._impl = _BACKEND_CLASSES[self.backend](self.index_dir, self.k1, self.b)

    def __len__(self) -> int:
        return self.meta["num_passages"]

    def __repr__(self) -> str:
        return (f"BM25Index({str(self.index_dir)!r}, backend={self.backend!r}, k1={self.k1}, b={self.b}, "
                f"passages={len(self)})")

    @classmethod
    def build(cls, passages_tsv: PathLike, index_dir: PathLike, backend: str = "pyserini",
              k1: float = 0.9, b: float = 0.4, threads: int | None = None) -> BM25Index:
        """Index every passage of `passages_tsv` into `index_dir` (replaced atomically)."""
        if backend not in BACKENDS:
            raise ValueError(f"unknown BM25 backend {backend!r}; choose one of {', '.join(BACKENDS)}")
        if not Path(passages_tsv).is_file():
            raise FileNotFoundError(f"passages file not found: {passages_tsv}")
        threads = threads or default_threads()
        source = _source_stamp(passages_tsv)
        start = time.perf_counter()
        with atomic_dir(index_dir) as tmp:
            n = _BACKEND_CLASSES[backend].build(read_passages(passages_tsv, progress=True, desc=f"BM25 ({backend}): read passages"), tmp, k1, b, threads)
            if n == 0:
                raise DataFormatError(passages_tsv, "line 2", "no passages after the header")
            meta = {"format": FORMAT_VERSION, "backend": backend, "k1": k1, "b": b, "num_passages": n,
                    "analyzer": "anserini-default-english" if backend == "pyserini" else ANALYZER,
                    "source": source}
            with atomic_open(tmp / META_FILE) as f:
                json.dump(meta, f, indent=2)
        seconds = time.perf_counter() - start
        log.info("BM25 (%s): indexed %d passages in %.1f s (%.0f/s) into %s", backend, n, seconds,
                 n / max(seconds, 1e-9), index_dir)
        return cls(index_dir, meta)

    @classmethod
    def load(cls, index_dir: PathLike) -> BM25Index:
        """Open an index built by `build`."""
        meta_path = Path(index_dir) / META_FILE
        if not meta_path.is_file():
            raise FileNotFoundError(f"not a BM25 index (no {META_FILE}): {index_dir}")
        meta = _read_meta(meta_path)
        if meta.get("format") != FORMAT_VERSION or meta.get("backend") not in BACKENDS:
            what = f"unsupported BM25 index: format {meta.get('format')!r}, backend {meta.get('backend')!r}"
            raise DataFormatError(meta_path, "top level", what)
        return cls(index_dir, meta)

    @classmethod
    def build_or_load(cls, passages_tsv: PathLike, index_dir: PathLike, backend: str = "pyserini",
                      k1: float = 0.9, b: float = 0.4, threads: int | None = None) -> BM25Index:
        """Load `index_dir` if it is a complete index of this TSV with these settings, else build it."""
        meta_path = Path(index_dir) / META_FILE
        if meta_path.is_file() and Path(passages_tsv).is_file():
            meta = _read_meta(meta_path)
            wanted = {"format": FORMAT_VERSION, "backend": backend, "k1": k1, "b": b,
                      "source": _source_stamp(passages_tsv)}
            if all(meta.get(key) == value for key, value in wanted.items()):
                log.info("BM25: reusing the index in %s", index_dir)
                return cls(index_dir, meta)
            log.info("BM25: the index in %s is for other data or settings; rebuilding it", index_dir)
        return cls.build(passages_tsv, index_dir, backend=backend, k1=k1, b=b, threads=threads)

    def search(self, query: str, k: int = 100) -> list[Hit]:
        """The top-k (passage_id, score) pairs for one query; fewer when fewer passages match."""
        return self._impl.search(query, k)

    def batch_search(self, queries: Sequence[str], k: int = 100,
                     threads: int | None = None, progress: bool = True) -> list[list[Hit]]:
        """`search` for many queries at once, in parallel; results in the order of `queries`.

        More than `SEARCH_BLOCK` queries are searched block by block under a progress bar (with
        ETA) unless `progress` is false (a caller with its own bar)."""
        if not queries:
            return []
        queries, threads = list(queries), threads or default_threads()
        if len(queries) <= SEARCH_BLOCK:
            return self._impl.batch_search(queries, k, threads)
        results: list[list[Hit]] = []
        with progress_bar(total=len(queries), desc=f"BM25 ({self.backend}): search", unit="question", enabled=progress) as bar:
            for start in range(0, len(queries), SEARCH_BLOCK):
                block = queries[start : start + SEARCH_BLOCK]
                results += self._impl.batch_search(block, k, threads)
                bar.update(len(block))
        return results

    def close(self) -> None:
        """Release the backend's resources (Lucene's index reader)."""
        self._impl.close()


@dataclass
class BM25Settings:
    """How a stage gets its BM25 index: backend, k1, b, where the index lives, search threads.

    `index_dir` None means the stage's own default location. `open` builds the index there
    from the passages TSV, or reuses it when it already indexes that TSV with these settings.
    """

    backend: BM25Backend = BM25Backend.pyserini
    k1: float = 0.9
    b: float = 0.4
    index_dir: str | None = None
    threads: int | None = None

    def __post_init__(self):
        self.backend = BM25Backend.parse(self.backend, "bm25.backend")

    @classmethod
    def from_dict(cls, d: dict | BM25Settings | None) -> BM25Settings:
        return cls() if d is None else settings_from(cls, d, "BM25")

    def open(self, passages_tsv: PathLike, default_dir: PathLike) -> BM25Index:
        index_dir = self.index_dir or default_dir
        return BM25Index.build_or_load(passages_tsv, index_dir, self.backend, self.k1, self.b, self.threads)

    def describe(self, index: BM25Index | None = None) -> dict:
        """The settings that decide the results (for results.json and summaries)."""
        out = {k: v for k, v in asdict(self).items() if k not in ("threads", "index_dir")}
        if index is not None:
            out.update(index=str(index.index_dir), analyzer=index.meta.get("analyzer"))
        return out
