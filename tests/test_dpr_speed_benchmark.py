"""benchmarks/dpr_speed: DPR §5.4's comparison on this machine. What is tested is the report's arithmetic (per-thread
rates, the extrapolation to 21M passages), the paper's figures coming from the one reference file, and the Lucene
corpus it searches; the timings themselves are the benchmark's records, not a test's."""

from __future__ import annotations

import pytest
from conftest import ROOT, load_script

from taser.data.passages import Passage, read_passages, write_passages
from taser.evaluation.reference_figures import reference_figures


@pytest.fixture(scope="module")
def bench():
    return load_script(ROOT / "benchmarks" / "dpr_speed" / "run.py", "dpr_speed_run")


def test_the_papers_figures_are_the_reference_files(bench):
    figures = reference_figures(bench.PAPER_ENTRY)
    assert figures["dense_hnsw_questions_per_s"] == 995.0 and figures["bm25_questions_per_s_per_thread"] == 23.7
    assert bench.DPR_HNSW == "hnsw:hnsw_m=512,ef_construction=200,ef_search=128"


def record(spec: str, count: int, build_s: float, qps2: float, qps1: float, recall: float) -> dict:
    return {"spec": spec, "count": count, "width": 768, "build_s": build_s, "build_peak_rss_gb": 1.0, "disk_gb": 1.0, "recall@100": recall,
            "search_2": {"qps": qps2, "threads": 2, "queries": 1000}, "search_1": {"qps": qps1, "threads": 1, "queries": 200}}


def test_the_report_gives_rates_per_thread_and_extrapolates_to_21m(bench):
    dense = [record("flat", 1_000_000, 20.0, 100.0, 60.0, 1.0), record(bench.DPR_HNSW, 50_000, 500.0, 3000.0, 1600.0, 0.987)]
    lucene = [{"count": 1_000_000, "build_s": 200.0, "build_threads": 2, "search_1": {"qps": 40.0, "threads": 1, "queries": 200}, "disk_gb": 0.5}]
    encode = {"passages_per_s": 30.0, "questions_per_s": 300.0, "precision": "bf16", "threads": 2, "passages": 2141}
    text = bench.report(dense, lucene, encode, cores=2)
    assert "| `flat` (exact) | 1,000,000 | 2 | 100.0 | 50.0 | 1.000 | 20 s | 50,000 |" in text
    assert "| DPR's HNSW (M 512, efC 200, efS 128) | 50,000 | 1 | 1,600.0 | 1,600.0 | 0.987 | 500 s | 100 | 995.0 q/s at 21M; build 8.5 h |" in text
    assert "| Lucene BM25 (pyserini, k1 0.9, b 0.4) | 1,000,000 | 1 | 40.0 | 40.0 | – | 200 s on 2 threads | 5,000 | 23.7 q/s per thread" in text
    assert "DPR's HNSW build: 58.4 h on 2 cores" in text  # 21,015,324 / (50,000 / 500 s) = 210,153 s
    assert "Exact search: 4.76 questions/s on 2 threads" in text  # 100 q/s x 1M / 21,015,324
    assert "Lucene index: 1.2 h on 2 threads" in text  # 21,015,324 / 5,000 per s = 4,203 s
    assert "30.0 passages/s, so 194.6 h on this CPU" in text and "70 GPU-hours" in text


def test_the_lucene_corpus_is_real_sentences_cut_to_dpr_passages(bench, tmp_path):
    source = tmp_path / "real.tsv"
    write_passages(source, [Passage("1", "The cat sat on the mat. A dog ran far away! Why is the sky blue? Ok."),
                            Passage("2", "Rivers flow into the sea. Mountains rise very high above.")])
    out = tmp_path / "synthetic.tsv"
    bench.write_lucene_corpus(out, 25, source)
    made = list(read_passages(out))
    assert [p.id for p in made] == [str(i) for i in range(1, 26)]
    assert all(len(p.text.split()) == bench.PASSAGE_WORDS for p in made)
    sentences = set(bench.sentences_of(source))
    assert "Ok." not in sentences and "Why is the sky blue?" in sentences  # fragments under 3 words are left out
    words = {w for s in sentences for w in s.split()}
    assert all(set(p.text.split()) <= words for p in made)
    first = out.stat()
    bench.write_lucene_corpus(out, 25, source)  # an existing corpus is kept (the records were measured on it), not written again
    assert (out.stat().st_ino, out.stat().st_mtime_ns) == (first.st_ino, first.st_mtime_ns)


def test_search_rates_at_21m_follow_a_power_law_through_the_two_largest_counts(bench):
    assert bench.at_21m([(1_000_000, 60.0)]) is None
    qps, slope = bench.at_21m([(10_000, 999.0), (1_000_000, 100.0), (4_000_000, 25.0)])  # 4x the passages, 1/4 the rate
    assert slope == pytest.approx(-1.0) and qps == pytest.approx(25.0 * 4_000_000 / 21_015_324)
    text = bench.report([record(bench.DPR_HNSW, 50_000, 50.0, 1000.0, 500.0, 0.98), record(bench.DPR_HNSW, 1_000_000, 2000.0, 400.0, 200.0, 0.95)],
                        [], None, cores=2)
    assert "DPR's HNSW search, one thread: about" in text and "Lucene BM25 search" not in text
