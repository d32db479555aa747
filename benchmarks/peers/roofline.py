"""How close a CPU training step comes to the GEMM roofline: the step's useful FLOPs at the rate
the machine multiplies matrices of the step's own shape, against the step's time (issue 35).

    python benchmarks/peers/roofline.py                        # precision auto, every lever, 3 rounds
    python benchmarks/peers/roofline.py --precision fp32 --isa avx2   # an AVX2 CPU's kernels, fp32
    python benchmarks/peers/roofline.py --levers baseline --rounds 1 --steps 3   # a quick look

The step is the demo's (`dpr` on the shipped all-MiniLM-L6-v2: 16 questions + 16 positives + 16
BM25 hard negatives, max 256 tokens, dropout 0.1, AdamW, clip 1.0), run by the library's own
`StepRunner`, gradient clipping and fused AdamW as the trainer runs them, on the same batches for
every setting.

Useful FLOPs count real tokens only: per encoder layer and input of n tokens, 2n(4h^2 + 2hf) for
the linear layers and 4n^2h for the attention core (q k^T and the probabilities times v), forward;
backward twice that. The count is checked at start-up against torch's own FLOP counter on an
unpadded batch.

The levers (`roofline_levers.py`) are measured in one process, step by step: each batch runs once
under every lever in turn, then the GEMM rate is measured again, at the step's shape ([T, h] x
[h, f] and [T, f] x [f, h], T the mean real tokens per step, in the step's precision, median of
20 products each); the levers' order rotates from batch to batch. A step's roofline fraction is its ideal time (its FLOPs at the mean of the
rates measured before and after its batch) over its measured time; a round's figure is the median
over its batches. The step-rate ratio against the first lever is paired by batch.

`--isa avx2` makes PyTorch, oneDNN and MKL dispatch their AVX2 kernels (ATEN_CPU_CAPABILITY,
ONEDNN_MAX_CPU_ISA, MKL_ENABLE_INSTRUCTIONS): an AVX2 CPU's code paths on a newer CPU, not an
AVX2 CPU's memory system or clock; the report says which.

Process-wide settings cannot be switched between steps: `--huge-pages-pairs N` (huge-page tensors,
`THP_MEM_ALLOC_ENABLE`) and `--freed-memory-pairs N` (glibc keeping freed memory,
`taser.runtime.keep_freed_memory`, on by default as in a CPU training run) compare each off and on
in N pairs of child processes, alternating which goes first.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

ISA_ENV = {"avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}}
BATCH, MAX_LENGTH, GEMM_REPEATS = 16, 256, 20


def parse_args() -> argparse.Namespace:
    from roofline_levers import LEVERS, REFERENCES

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=None, help="default: outputs/bench-peers")
    ap.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16"])
    ap.add_argument("--isa", choices=["native", *ISA_ENV], default="native")
    ap.add_argument("--levers", nargs="+", default=list(LEVERS), choices=[*LEVERS, *REFERENCES],
                    help="default: every lever; the references (dropout off, not equal maths) show what the gap is made of")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6, help="timed batches per round (each run once per lever)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed batches first (each run once per lever)")
    ap.add_argument("--profile", type=int, default=0, metavar="ROWS",
                    help="instead of timing: torch.profiler's top ROWS operators of one step per lever")
    ap.add_argument("--huge-pages-pairs", type=int, default=0, metavar="N",
                    help="compare huge-page tensors off and on (THP_MEM_ALLOC_ENABLE) in N pairs of processes")
    ap.add_argument("--freed-memory-pairs", type=int, default=0, metavar="N",
                    help="compare glibc returning freed memory and keeping it (TASER_KEEP_FREED_MEMORY) in N pairs of processes")
    ap.add_argument("--json", type=Path, default=None, help="also write the raw figures here")
    return ap.parse_args()


# -- FLOPs -------------------------------------------------------------------------------------


def useful_flops(lengths: list[int], layers: int, hidden: int, ffn: int) -> float:
    """Forward + backward FLOPs of a BERT encoder over inputs of these real lengths."""
    forward = sum(layers * (2 * n * (4 * hidden * hidden + 2 * hidden * ffn) + 4 * n * n * hidden) for n in lengths)
    return 3.0 * forward


def check_flop_count(encoder, config) -> None:
    """The formula's forward against torch's FLOP counter over the layers, on an unpadded batch of 2 x 37 tokens."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    ids = torch.randint(1000, 2000, (2, 37))
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        encoder(input_ids=ids, attention_mask=torch.ones_like(ids))
    layers, hidden, ffn = config.num_hidden_layers, config.hidden_size, config.intermediate_size
    expected = useful_flops([37, 37], layers, hidden, ffn) / 3
    counted = sum(counter.get_flop_counts()[f"{type(encoder).__name__}.encoder"].values())  # the layers: no pooler
    if abs(counted - expected) > 1e-6 * expected:
        raise SystemExit(f"FLOP formula {expected:.6g} disagrees with torch's counter {counted:.6g}")


# -- the GEMM rate -------------------------------------------------------------------------------


def gemm_rate(tokens: int, hidden: int, ffn: int, dtype) -> float:
    """FLOP/s of [T, h] x [h, f] and [T, f] x [f, h] (median of GEMM_REPEATS each; their mean)."""
    import torch

    rates = []
    for a_shape, b_shape in (((tokens, hidden), (hidden, ffn)), ((tokens, ffn), (ffn, hidden))):
        a, b = torch.randn(a_shape, dtype=dtype), torch.randn(b_shape, dtype=dtype)
        torch.mm(a, b)
        times = []
        for _ in range(GEMM_REPEATS):
            start = time.perf_counter()
            torch.mm(a, b)
            times.append(time.perf_counter() - start)
        rates.append(2 * tokens * hidden * ffn / statistics.median(times))
    return sum(rates) / len(rates)


# -- the step ------------------------------------------------------------------------------------


def build(work: Path, precision: str, count: int):
    import torch
    from common import BASE_TRAIN, prepare_squad_with_bm25
    from run import triplet_examples, triplets

    from taser.models.loading import load_model
    from taser.training.batching import collate
    from taser.training.config import TrainConfig
    from taser.training.step import StepRunner

    data = prepare_squad_with_bm25(work)
    rows = triplets(data["train_files"][0], count * BATCH, BASE_TRAIN["seed"])
    model, tokenizer = load_model({"model_type": "dpr", "max_length": MAX_LENGTH, "max_question_length": MAX_LENGTH})
    batches = []
    for i in range(count):
        chunk = rows[i * BATCH:(i + 1) * BATCH]
        examples = triplet_examples(chunk)
        batches.append(collate(examples, tokenizer, MAX_LENGTH, MAX_LENGTH))
    torch.manual_seed(BASE_TRAIN["seed"])
    model.train()
    cfg = TrainConfig.from_value({**BASE_TRAIN, "batch_size": BATCH, "precision": precision})
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.learning_rate, fused=True)  # as the trainer
    runner = StepRunner(model, cfg.loss_config(model.config), precision, torch.device("cpu"))
    return model, optimizer, runner, batches


def lengths_of(batch) -> list[int]:
    return [int(n) for side in (batch.questions, batch.passages) for n in side["attention_mask"].sum(1)]


def one_step(model, optimizer, runner, batch) -> None:
    """Forward, backward, clipping and the optimizer step, as the trainer runs them."""
    from taser.training.grad_norms import clip_gradients

    runner.run(batch, global_questions=len(batch.positive_idx))
    clip_gradients([(n, p) for n, p in model.named_parameters() if p.requires_grad], 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def timed_step(model, optimizer, runner, batch, lever) -> float:
    with lever(model):
        start = time.perf_counter()
        one_step(model, optimizer, runner, batch)
        return time.perf_counter() - start


def warm(model, optimizer, runner, batches, levers) -> None:
    from roofline_levers import SETTINGS

    for batch in batches:
        for name in levers:
            with SETTINGS[name](model):
                one_step(model, optimizer, runner, batch)


def profile_levers(args, model, optimizer, runner, batches) -> None:
    from roofline_levers import SETTINGS
    from torch.profiler import ProfilerActivity, profile

    warm(model, optimizer, runner, batches[:args.warmup], args.levers)
    for name in args.levers:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            seconds = timed_step(model, optimizer, runner, batches[args.warmup], SETTINGS[name])
        print(f"{name}: one step, {seconds:.2f} s profiled")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.profile), flush=True)


def measure(args) -> dict:
    """The levers in this process (see the module docstring); prints and returns the figures."""
    import torch
    from common import ROOT, machine_line, peak_rss_gb
    from roofline_levers import SETTINGS

    from taser.runtime import huge_page_tensors, keep_freed_memory, resolve_precision

    thp = huge_page_tensors()
    kept = keep_freed_memory()  # as a CPU training run does (taser.runtime.training_record)
    precision = resolve_precision(args.precision)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    model, optimizer, runner, batches = build(args.work or ROOT / "outputs" / "bench-peers", precision, args.warmup + args.steps)
    encoder = model.question_encoder
    hf = encoder.config
    layers, hidden, ffn = hf.num_hidden_layers, hf.hidden_size, hf.intermediate_size
    check_flop_count(encoder, hf)
    flops = [useful_flops(lengths_of(b), layers, hidden, ffn) for b in batches]
    tokens = round(statistics.mean(sum(lengths_of(b)) for b in batches))
    print(machine_line(args.precision), f"ISA: {args.isa} (torch dispatch: {torch.backends.cpu.get_cpu_capability()}), "
          f"threads {torch.get_num_threads()}, huge-page tensors {'on' if thp else 'off'}, freed memory kept {'on' if kept else 'off'}",
          flush=True)
    print(f"step: {len(batches[0].positive_idx)} questions + {len(batches[0].ctx_owner)} passages, {tokens} real tokens on average, "
          f"{statistics.mean(flops) / 1e9:.0f} GFLOP useful", flush=True)
    if args.profile:
        profile_levers(args, model, optimizer, runner, batches)
        return {}
    warm(model, optimizer, runner, batches[:args.warmup], args.levers)
    timed = batches[args.warmup:]
    results = {name: [] for name in args.levers}
    rate = gemm_rate(tokens, hidden, ffn, dtype)
    for r in range(args.rounds):
        steps = {name: [] for name in args.levers}
        for i, batch in enumerate(timed):
            # every lever on the same batch, one after another (drift reaches them alike), the
            # order rotated from batch to batch (no lever always follows the GEMM measurement)
            order = args.levers[i % len(args.levers):] + args.levers[:i % len(args.levers)]
            times = {name: timed_step(model, optimizer, runner, batch, SETTINGS[name]) for name in order}
            after = gemm_rate(tokens, hidden, ffn, dtype)
            ideal = flops[args.warmup + i] / ((rate + after) / 2)
            for name, t in times.items():
                steps[name].append({"s": t, "fraction": ideal / t, "gemm": (rate + after) / 2e9})
            rate = after
        for name in args.levers:
            row = {"round": r + 1, "lever": name, "step_s": statistics.median(x["s"] for x in steps[name]),
                   "gemm": statistics.median(x["gemm"] for x in steps[name]),
                   "fraction": statistics.median(x["fraction"] for x in steps[name]),
                   "vs_first": statistics.median(a["s"] / b["s"] for a, b in zip(steps[args.levers[0]], steps[name]))}
            results[name].append(row)
            print(json.dumps(row), flush=True)
    print_table(results, args.levers[0])
    return {"machine": machine_line(args.precision), "isa": args.isa, "capability": torch.backends.cpu.get_cpu_capability(),
            "huge_page_tensors": thp, "freed_memory_kept": kept, "tokens": tokens, "gflop": statistics.mean(flops) / 1e9, "peak_rss_gb": peak_rss_gb(),
            "results": results}


def print_table(results: dict, first: str, label: str = "lever") -> None:
    print(f"| {label} | step s (median per round) | GEMM GFLOP/s (median per round) | roofline fraction (per round) | median | "
          f"step rate vs {first} (per round) |")
    print("|---|---|---|---|---|---|")
    for name, rows in results.items():
        steps_s = ", ".join(f"{x['step_s']:.2f}" for x in rows)
        rates = ", ".join(f"{x['gemm']:.0f}" for x in rows)
        fractions = ", ".join(f"{100 * x['fraction']:.1f}%" for x in rows)
        ratios = ", ".join(f"{x['vs_first']:.3f}" for x in rows)
        print(f"| {name} | {steps_s} | {rates} | {fractions} | {100 * statistics.median(x['fraction'] for x in rows):.1f}% | "
              f"{statistics.median(x['vs_first'] for x in rows):.3f}x ({ratios}) |")


# process-wide settings, compared in pairs of child processes: option -> (environment variable, the record's key, what it is)
PROCESS_SETTINGS = {
    "huge_pages_pairs": ("THP_MEM_ALLOC_ENABLE", "huge_page_tensors", "huge-page tensors"),
    "freed_memory_pairs": ("TASER_KEEP_FREED_MEMORY", "freed_memory_kept", "freed memory kept"),
}


def compare_process_setting(args, option: str) -> dict:
    """A process-wide setting off and on: pairs of child processes, each running every lever for
    `--rounds`; the order within a pair alternates. The children get this command without the
    pairs option."""
    import tempfile

    env_name, key, label = PROCESS_SETTINGS[option]
    pairs = getattr(args, option)
    flag = "--" + option.replace("_", "-")
    argv = sys.argv[1:]
    i = argv.index(flag)
    argv = argv[:i] + argv[i + 2:]
    children = {"off": [], "on": []}
    for pair in range(pairs):
        for setting in (("off", "on") if pair % 2 == 0 else ("on", "off")):
            with tempfile.TemporaryDirectory() as tmp:
                out = Path(tmp) / "child.json"
                env = {**os.environ, env_name: "1" if setting == "on" else "0"}
                subprocess.run([sys.executable, __file__, *argv, "--json", str(out)], env=env, check=True)
                child = json.loads(out.read_text())
            if child[key] != (setting == "on"):
                raise SystemExit(f"{label} asked {setting}, but the child found it {'on' if child[key] else 'off'}")
            children[setting].append(child)
    combined = {}
    for setting, runs in children.items():
        for name in args.levers:
            combined[f"{label} {setting}, {name}"] = [row for run in runs for row in run["results"][name]]
    peaks = "; ".join(f"{k} " + ", ".join(f"{c['peak_rss_gb']:.2f}" for c in v) for k, v in children.items())
    print(f"\n{label} off and on, {pairs} pairs of processes; peak RSS GB: {peaks}")
    print_table(combined, args.levers[0], "setting")
    return {"machine": children["on"][0]["machine"], "children": children}


def main() -> None:
    args = parse_args()
    for key, value in ISA_ENV.get(args.isa, {}).items():
        os.environ[key] = value  # before torch loads: its dispatch reads them once
    from common import command_line

    option = next((o for o in PROCESS_SETTINGS if getattr(args, o)), None)
    figures = compare_process_setting(args, option) if option else measure(args)
    print(f"\n{command_line(__file__)}")
    if args.json and figures:
        args.json.write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
