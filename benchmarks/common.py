"""Shared set-up of the benchmarks: the SQuAD protocol's data, with BM25 hard negatives."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from taser.cli import setup_logging  # noqa: E402
from taser.data.squad import convert_squad  # noqa: E402

SQUAD = ROOT / "data" / "squad" / "squad-v1.1-dev-40-articles.json"
MINILM_CLS = {"model_type": "dpr", "pretrained": "shipped:all-MiniLM-L6-v2", "pooling": "cls", "normalize": False}
log = logging.getLogger("benchmark")


def prepare_squad_with_bm25(work: Path) -> dict:
    """Convert the shipped SQuAD file and mine 1+ BM25 hard negatives per training question (reused)."""
    from taser.pipeline.mine import mine_negatives

    setup_logging()
    data_dir = work / "data"
    if not (data_dir / "summary.json").is_file():
        convert_squad(SQUAD, data_dir)
    mined = data_dir / "train.bm25.json"
    if not mined.is_file():
        mine_negatives(data_dir / "train.json", data_dir / "passages.tsv", mined, retriever="bm25", top_n=100, num_hard_negatives=30, bm25={"backend": "pyserini"}, progress=False)
    return {
        "passages": str(data_dir / "passages.tsv"),
        "qa_file": str(data_dir / "dev.qa.tsv"),
        "train_files": [str(mined)],
        "dev_file": str(data_dir / "dev.json"),
        "match": "string",
    }


def measure_in_child(script: str, *args: str) -> dict:
    """Run `script --measure ...` in a fresh process (so its peak memory is its own); its last stdout line is JSON."""
    proc = subprocess.run([sys.executable, script, "--measure", *args], capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])
