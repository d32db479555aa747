"""Does keeping freed memory (`taser.runtime.keep_freed_memory`) speed up CPU training? The
library's `Trainer` at the roofline's settings (`dpr` on the shipped all-MiniLM-L6-v2, 16
questions + 16 positives + 16 BM25 hard negatives, max 256 tokens, dropout 0.1), in pairs of
fresh processes, one with `TASER_KEEP_FREED_MEMORY=0` and one without (the default: kept); the
order alternates from pair to pair, and every process trains on the same batches.

    python benchmarks/peers/freed_memory.py --isa avx2 --precision fp32   # 3 pairs of 14 steps, ~8 min on 2 cores

A step is timed from one step's end to the next (`on_step`), as are its page faults and system
time; the first `--warmup` steps of each process are left out. Unlike `roofline.py`, nothing runs
between the steps but the trainer itself, so the allocator sees what a training run gives it.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from common import BASE_TRAIN, ROOT, command_line, machine_line, peak_rss_gb, prepare_squad_with_bm25  # noqa: E402
from roofline import BATCH, ISA_ENV, MAX_LENGTH  # noqa: E402


def child(args) -> dict:
    from taser.data.biencoder_json import BiEncoderJsonFile
    from taser.models.loading import load_model
    from taser.training.config import TrainConfig
    from taser.training.trainer import Trainer

    train_file = prepare_squad_with_bm25(args.work)["train_files"][0]
    model, tokenizer = load_model({"model_type": "dpr", "max_length": MAX_LENGTH, "max_question_length": MAX_LENGTH})
    cfg = TrainConfig.from_value({**BASE_TRAIN, "batch_size": BATCH, "max_steps": args.steps, "precision": args.precision,
                                  "log_every": 10**6})
    marks = []

    def on_step(*_):
        usage = resource.getrusage(resource.RUSAGE_SELF)
        marks.append((time.perf_counter(), usage.ru_minflt, usage.ru_stime))

    trainer = Trainer(model, tokenizer, [BiEncoderJsonFile(train_file)], cfg, args.work / "run-freed-memory", on_step=on_step)
    trainer.train()
    steps = [{"s": b[0] - a[0], "faults": b[1] - a[1], "sys_s": b[2] - a[2]} for a, b in zip(marks, marks[1:])][args.warmup:]
    return {"kept": trainer.runtime["hardware"]["freed_memory_kept"], "steps": steps,
            "peak_rss_gb": peak_rss_gb(), "machine": machine_line(args.precision)}


def in_child(args, kept: bool) -> dict:
    cmd = [sys.executable, __file__, "--child", "--steps", str(args.steps), "--warmup", str(args.warmup), "--precision", args.precision,
           "--work", str(args.work)]
    env = {**os.environ, **ISA_ENV.get(args.isa, {}), "TASER_KEEP_FREED_MEMORY": "1" if kept else "0", "HF_HUB_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode:
        raise SystemExit(f"{cmd} failed:\n{proc.stderr[-4000:]}")
    run = json.loads(proc.stdout.strip().splitlines()[-1])
    if run["kept"] != kept:
        raise SystemExit(f"freed memory kept asked {kept}, but the trainer recorded {run['kept']}")
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=ROOT / "outputs" / "bench-peers")
    ap.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16"])
    ap.add_argument("--isa", choices=["native", *ISA_ENV], default="native")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=14)
    ap.add_argument("--warmup", type=int, default=2, help="first steps of each process left out")
    ap.add_argument("--json", type=Path, default=None, help="also write the raw figures here")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return
    runs = []
    for pair in range(args.pairs):
        for kept in ((False, True) if pair % 2 == 0 else (True, False)):
            run = in_child(args, kept)
            run["pair"] = pair + 1
            runs.append(run)
            median = statistics.median(s["s"] for s in run["steps"])
            print(f"pair {pair + 1}, kept {'on' if kept else 'off'}: median step {median:.3f} s, "
                  f"faults/step {statistics.median(s['faults'] for s in run['steps']):,.0f}, "
                  f"system s/step {statistics.median(s['sys_s'] for s in run['steps']):.2f}, peak RSS {run['peak_rss_gb']:.2f} GB", flush=True)
    print(f"\n{runs[0]['machine']}; ISA: {args.isa}; {args.steps} steps a process, the first {args.warmup} left out\n")
    print("| pair | step s, kept off (median) | step s, kept on (median) | step rate, on vs off | faults per step off / on | system s per step off / on |")
    print("|---|---|---|---|---|---|")
    ratios = []
    for pair in range(1, args.pairs + 1):
        off, on = (next(r for r in runs if r["pair"] == pair and r["kept"] == k) for k in (False, True))
        m = {k: {f: statistics.median(s[f] for s in r["steps"]) for f in ("s", "faults", "sys_s")} for k, r in (("off", off), ("on", on))}
        ratios.append(m["off"]["s"] / m["on"]["s"])
        print(f"| {pair} | {m['off']['s']:.3f} | {m['on']['s']:.3f} | {ratios[-1]:.3f}x | {m['off']['faults']:,.0f} / {m['on']['faults']:,.0f} | "
              f"{m['off']['sys_s']:.2f} / {m['on']['sys_s']:.2f} |")
    print(f"\nmedian step-rate ratio (kept on vs off, paired by pair): {statistics.median(ratios):.3f}x")
    print(f"\n{command_line(__file__)}")
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
