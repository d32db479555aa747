"""DPR's experiments in miniature, with seeds: the table preset `configs/table/dpr_cpu.yaml` run pair by
pair on the shipped SQuAD protocol by the ablations' runner (`benchmarks/ablations/run.py`: the same
options, records, resumption and report), its report against `dpr` and BM25.

    python benchmarks/dpr_cpu/run.py                           # every row, seeds 1 2 3
    python benchmarks/dpr_cpu/run.py --rows dpr n100 --seeds 1 # some pairs (the others keep what they have)
    python benchmarks/dpr_cpu/run.py --report-only             # results.md from every recorded pair

Rows: BM25; `dpr` (in-batch + 1 BM25 negative, batch 16, gold positives, dot product + NLL on MiniLM's
unit vectors); Figure 1's fixed subsets of 100, 400 and 1,600 training questions (drawn once per
seed); Table 3's 1-of-N rows with 7 random, BM25 or gold negatives, in-batch negatives alone at batch
8, 16 and 32 (800 questions each: 100, 50 and 25 steps), and 2 BM25 negatives; Table 5's distant
positives; Table 6's dot / L2 x NLL / triplet on raw vectors. Finished pairs are recorded under
`benchmarks/dpr_cpu/runs/` (results.json, per_query.jsonl, times.json); the section of results.md
from "## What the study supports" on is written by hand and kept across re-runs.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _runner():
    spec = importlib.util.spec_from_file_location("ablations_run", HERE.parent / "ablations" / "run.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    module.use_study("dpr_cpu", "DPR's ablations in miniature, with seeds, on the SQuAD benchmark (shipped data)",
                     ("dpr (in-batch + 1 BM25, batch 16)", "BM25"), __file__, HERE)
    return module


if __name__ == "__main__":
    _runner().main()
