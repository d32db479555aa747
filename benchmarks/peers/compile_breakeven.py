"""When does `train.compile=true` pay? Its one-time compile against the time it saves per step,
at the peer benchmark's training settings (`run.py`: the shipped all-MiniLM-L6-v2 as a `shared`
model, 16 questions + 16 positives + 16 BM25 hard negatives, max 256 tokens, precision `auto`).

    python benchmarks/peers/compile_breakeven.py                 # eager, compiled cold, compiled warm; ~30+ min on 2 cores
    python benchmarks/peers/compile_breakeven.py --tiny --steps 4   # a tiny random model, one graph: checks the script runs (figures meaningless)

Three runs of `Trainer`, each in a fresh process, one after the other:

1. eager (the library's defaults, `train.compile=false`);
2. compiled, with an empty compiler cache: the first step includes compiling (cold);
3. compiled again, same settings, same cache: the first step reads the graphs from the cache (warm).

A step is timed from one step's end to the next; the first step from the start of `train()`.
The one-time cost of a compiled run is its first step beyond its median step, less the eager
run's own first-step excess (warm-up both have); the break-even step count is that cost over
the step time saved, (eager median - compiled median): a run longer than that is faster
compiled. Written to `compile_results.md` with the machine line.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from common import BASE_TRAIN, ROOT, command_line, machine_line, prepare_squad, prepare_squad_with_bm25  # noqa: E402
from run import BATCH, LR, MAX_LENGTH, SCALE, WARMUP_STEPS  # noqa: E402

RUNS = (("eager", False), ("compiled, cold cache", True), ("compiled, warm cache", True))


def tiny_model(work: Path) -> dict:
    """A 2-layer random BERT with MiniLM's tokenizer (for --tiny: the script's plumbing, not its figures)."""
    from transformers import BertConfig, BertModel

    from taser.models.biencoder import load_tokenizer

    path = work / "tiny-bert"
    if not (path / "config.json").is_file():
        tokenizer = load_tokenizer("shipped:all-MiniLM-L6-v2")
        BertModel(BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                             intermediate_size=128)).save_pretrained(path)
        tokenizer.save_pretrained(path)
    return {"model_type": "shared", "pretrained": str(path), "pooling": "mean", "normalize": True, "max_length": 32, "max_question_length": 32}


# --tiny: one shape for both sides (no hard negative, one bucket), so one graph compiles
TINY_TRAIN = {"hard_negatives": 0, "compile_buckets": 1}


def child(compiled: bool, steps: int, work: Path, cache: Path, tiny: bool) -> dict:
    from taser.data.biencoder_json import BiEncoderJsonFile
    from taser.models.loading import load_model
    from taser.training.config import TrainConfig
    from taser.training.trainer import Trainer

    if tiny:
        train_file, model_cfg = str(prepare_squad(work)), tiny_model(work)
    else:
        train_file = prepare_squad_with_bm25(work)["train_files"][0]
        model_cfg = {"model_type": "shared", "max_length": MAX_LENGTH, "max_question_length": MAX_LENGTH}
    model, tokenizer = load_model(model_cfg)
    cfg = TrainConfig.from_value({**BASE_TRAIN, "batch_size": BATCH, "max_steps": steps, "learning_rate": LR, "warmup_steps": WARMUP_STEPS,
                                  "temperature": 1 / SCALE, "log_every": 10**6, "compile": compiled, "compile_cache_dir": str(cache),
                                  **(TINY_TRAIN if tiny else {})})
    ends: list[float] = []
    trainer = Trainer(model, tokenizer, [BiEncoderJsonFile(train_file)], cfg, work / "run", on_step=lambda *_: ends.append(time.perf_counter()))
    start = time.perf_counter()
    result = trainer.train()
    gaps = [b - a for a, b in zip(ends, ends[1:])]
    return {"first_step_s": ends[0] - start, "step_s": gaps, "compile": result.compile}


def in_child(compiled: bool, args, cache: Path) -> dict:
    cmd = [sys.executable, __file__, "--child", "compiled" if compiled else "eager", "--steps", str(args.steps), "--work", str(args.work),
           "--cache", str(cache)] + (["--tiny"] if args.tiny else [])
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"})
    if proc.returncode:
        raise SystemExit(f"{cmd} failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def breakeven(one_time_s: float, eager_step_s: float, compiled_step_s: float) -> str:
    saved = eager_step_s - compiled_step_s
    if saved <= 0:
        return "never (compiled steps are not faster)"
    return f"{one_time_s / saved:,.0f} steps"


def report(runs: dict[str, dict], args) -> str:
    med = {name: statistics.median(r["step_s"][args.warmup - 1:]) for name, r in runs.items()}
    excess = {name: r["first_step_s"] - med[name] for name, r in runs.items()}
    eager = "eager"
    lines = ["| run | first step s | median step s (after warm-up) | one-time cost s (first-step excess beyond eager's) | graphs compiled | "
             "FX graph cache hits / misses |", "|---|---|---|---|---|---|"]
    for name, r in runs.items():
        c = r["compile"] or {}
        one_time = "" if name == eager else f"{excess[name] - excess[eager]:.1f}"
        hits = f"{c['fxgraph_cache_hit']} / {c['fxgraph_cache_miss']}" if c else ""
        lines.append(f"| {name} | {r['first_step_s']:.1f} | {med[name]:.2f} | {one_time} | {c.get('graphs', '')} | {hits} |")
    cold, warm = "compiled, cold cache", "compiled, warm cache"
    compiled_step = statistics.median([med[cold], med[warm]])
    return (
        "# torch.compile break-even (`train.compile=true`)\n\n"
        f"{machine_line()}\n\n"
        f"Command: `{command_line(__file__)}`{' (tiny random model: checks the script, not a measurement)' if args.tiny else ''}.\n\n"
        f"{args.steps} steps per run, medians after {args.warmup} warm-up step(s); each run a fresh process, one after the other.\n\n"
        + "\n".join(lines) + "\n\n"
        f"- Eager vs compiled median step: {med[eager]:.2f} s vs {compiled_step:.2f} s "
        f"({med[eager] / compiled_step:.2f}x step rate).\n"
        f"- Break-even, cold cache (first run of these settings): **{breakeven(excess[cold] - excess[eager], med[eager], compiled_step)}**.\n"
        f"- Break-even, warm cache (a later run): **{breakeven(excess[warm] - excess[eager], med[eager], compiled_step)}**.\n"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", type=Path, default=ROOT / "outputs" / "bench-peers")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--tiny", action="store_true", help="a tiny random model on SQuAD without BM25: checks the script runs")
    ap.add_argument("--out", type=Path, default=None, help="default: compile_results.md here (--tiny: under --work)")
    ap.add_argument("--child", choices=["eager", "compiled"])
    ap.add_argument("--cache", type=Path)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child == "compiled", args.steps, args.work, args.cache, args.tiny)))
        return
    if args.steps < args.warmup + 2:
        raise SystemExit(f"--steps must be at least --warmup + 2 ({args.warmup + 2})")
    cache = args.work / "compile-cache"
    shutil.rmtree(cache, ignore_errors=True)  # the first compiled run starts cold
    runs = {}
    for name, compiled in RUNS:
        runs[name] = in_child(compiled, args, cache)
        print(f"{name}: first step {runs[name]['first_step_s']:.1f} s", file=sys.stderr)
    text = report(runs, args)
    out = args.out or (args.work / "compile_results.md" if args.tiny else HERE / "compile_results.md")
    out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
