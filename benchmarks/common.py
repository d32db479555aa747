"""Shared set-up of the benchmarks: the SQuAD protocol's data, with BM25 hard negatives, the
TrainConfig settings they share, and the helpers their reports use."""

from __future__ import annotations

import json
import logging
import os
import resource
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from taser.cli import setup_logging  # noqa: E402
from taser.data.squad import convert_squad  # noqa: E402

SQUAD = ROOT / "data" / "squad" / "squad-v1.1-dev-40-articles.json"
MINILM_CLS = {"model_type": "dpr", "pretrained": "shipped:all-MiniLM-L6-v2", "pooling": "cls", "normalize": False}
# TrainConfig settings every benchmark shares (each script adds or overrides its own): the
# reference protocol's seed, learning rate, 1 BM25 hard negative per question and clip 1.0;
# no checkpoints, no per-run validation, no progress bars.
BASE_TRAIN = {
    "hard_negatives": 1, "learning_rate": 2e-5, "grad_clip": 1.0, "seed": 12345,
    "save_every": 0, "val_max_questions": 0, "progress": False,
}
log = logging.getLogger("benchmark")


def command_line(script: str | os.PathLike, argv: list[str] | None = None) -> str:
    """`python benchmarks/<x>/run.py <args>`: how this run was started (argv: default sys.argv[1:])."""
    path = Path(script).resolve()
    try:
        path = path.relative_to(ROOT)
    except ValueError:
        pass
    args = sys.argv[1:] if argv is None else argv
    return shlex.join(["python", path.as_posix(), *args])


def machine_line(precision: str = "auto") -> str:
    """'Machine: AMD EPYC (AVX2, no native bf16), 2 cores, torch 2.13.0+cpu; precision auto -> fp32'.

    Every results.md quotes this beside its figures: speed depends on the CPU kind, and `auto`
    resolves differently on CPUs with and without native bf16.
    """
    import torch

    from taser.runtime import describe_hardware, resolve_precision

    resolved = resolve_precision(precision)
    shown = f"auto -> {resolved}" if precision == "auto" else resolved
    return f"Machine: {describe_hardware()}, torch {torch.__version__}; precision {shown}."


def recorded_machine_line(results_files) -> str:
    """The machine line of figures recorded elsewhere: the machines their results.json files name
    (`hardware`, `precision`), not the one writing the report."""
    seen = []
    for path in results_files:
        results = json.loads(Path(path).read_text())
        h = results.get("hardware") or {}
        if not h:
            continue
        bf16 = "native" if h.get("cpu_native_bf16") else "no native"
        precision = results.get("precision")
        requested = results.get("precision_requested")
        shown = f"{requested} -> {precision}" if requested == "auto" else precision
        line = f"{h.get('cpu')} ({h.get('cpu_capability')}, {bf16} bf16), {h.get('cores')} cores, torch {h.get('torch')}; precision {shown}"
        if line not in seen:
            seen.append(line)
    if not seen:
        return "Machine: not recorded."
    return "Machine: " + "; and ".join(seen) + "."


def write_keeping_section(out: Path, text: str, heading: str) -> None:
    """Write `text` to `out`, keeping what the earlier `out` held from `heading` on: a section
    written by hand (levers, how the figures were gathered) survives a re-run."""
    kept = out.read_text().partition(heading)[2] if out.is_file() else ""
    out.write_text(text + (f"\n{heading}{kept}" if kept else ""))


def peak_rss_gb() -> float:
    """This process's peak resident memory so far, in GB: Linux's VmHWM, the peak of this program's own memory.
    Not ru_maxrss: Linux carries it across exec from the forked copy of the parent, so a child started by a 6 GB
    benchmark process reported 6 GB whatever it used (issue 49's run; sentence-transformers' child reads VmHWM)."""
    status = Path("/proc/self/status")
    if status.is_file():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024**2  # KiB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1024**3 if sys.platform == "darwin" else 1024**2)  # bytes on macOS


def prepare_squad(work: Path, limit_train: int | None = None) -> Path:
    """Convert the shipped SQuAD file into `work/data` (once); return the training file.

    limit_train: only the first N training questions, in `train.firstN.json` (written only when
    missing or older than `train.json`, so files derived from it stay fresh).
    """
    setup_logging()
    data_dir = work / "data"
    if not (data_dir / "summary.json").is_file():
        convert_squad(SQUAD, data_dir)
    train = data_dir / "train.json"
    if limit_train:
        from taser.data.biencoder_json import BiEncoderJsonFile, write_biencoder_json

        subset = data_dir / f"train.first{limit_train}.json"
        if not subset.is_file() or subset.stat().st_mtime < train.stat().st_mtime:
            source = BiEncoderJsonFile(train)
            write_biencoder_json(subset, (source[i] for i in range(min(limit_train, len(source)))))
        train = subset
    return train


def prepare_squad_with_bm25(work: Path, backend: str = "pyserini", index_dir: Path | None = None,
                            limit_train: int | None = None, tag: str = "bm25") -> dict:
    """Convert the shipped SQuAD file and mine 1+ BM25 hard negatives per training question (reused).

    The negatives (the 30 highest-ranked of BM25's top-100 without an answer) go to
    `work/data/train[.firstN].<tag>.json`, mined again only when missing or older than the
    training file. backend: `pyserini` or `bm25s`; index_dir: the BM25 index (default
    `work/data/bm25-<backend>`); limit_train: see `prepare_squad`.
    """
    from taser.pipeline.mine import mine_negatives

    train = prepare_squad(work, limit_train)
    data_dir = work / "data"
    mined = train.with_name(train.name.replace(".json", f".{tag}.json"))
    if not mined.is_file() or mined.stat().st_mtime < train.stat().st_mtime:
        bm25 = {"backend": backend} if index_dir is None else {"backend": backend, "index_dir": str(index_dir)}
        mine_negatives(train, data_dir / "passages.tsv", mined, retriever="bm25", top_n=100, num_hard_negatives=30, bm25=bm25, progress=False)
    return {
        "passages": str(data_dir / "passages.tsv"),
        "qa_file": str(data_dir / "dev.qa.tsv"),
        "train_files": [str(mined)],
        "dev_file": str(data_dir / "dev.json"),
        "match": "string",
    }


def encode_rates(model, tokenizer, passages: list, questions: list[str], precision: str) -> tuple[float, float]:
    """Passages/s and questions/s of `model` at the batch sizes every benchmark times encoding with (64 and 128)."""
    import time

    from taser.models.encoding import encode_passages, encode_questions

    start = time.perf_counter()
    encode_passages(model, tokenizer, passages, batch_size=64, precision=precision)
    p_rate = len(passages) / (time.perf_counter() - start)
    start = time.perf_counter()
    encode_questions(model, tokenizer, questions, batch_size=128, precision=precision)
    return p_rate, len(questions) / (time.perf_counter() - start)


def measure_in_child(script: str, *args: str) -> dict:
    """Run `script --measure ...` in a fresh process (so its peak memory is its own); its last stdout line is JSON."""
    proc = subprocess.run([sys.executable, script, "--measure", *args], capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])
