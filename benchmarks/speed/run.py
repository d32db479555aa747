"""Speed, memory and accuracy of taser's `dpr` model at the DPR reference's settings (issue 5).

    python benchmarks/speed/run.py                 # everything, ~25 min on 2 cores
    python benchmarks/speed/run.py --skip-accuracy # timing only

Timing: batch 16 questions + 16 positives + 16 BM25 hard negatives, max 256 tokens, [CLS]
pooling, lr 2e-5, at precision `auto` (bf16 where the CPU has it natively, else fp32; or the
comma-separated list --precision gives), each setting in its own process (so peak memory is its own).
Accuracy: the reference's 150-step run (a seeded random 2,400 training questions, one BM25 hard
negative each, warm-up 15, clip 1.0, dropout 0.1) with [CLS] and with the model's mean pooling.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import BASE_TRAIN, MINILM_CLS, ROOT, command_line, encode_rates, machine_line, measure_in_child, peak_rss_gb, prepare_squad_with_bm25  # noqa: E402

REFERENCE = {"s_per_step": 10.15, "peak_gb": 7.8, "passages_per_s": 17.9, "questions_per_s": 15.4, "top_k": {"1": 46.1, "5": 75.6, "20": 90.0, "100": 97.2}}
TRAIN = {**BASE_TRAIN, "batch_size": 16, "warmup_steps": 15, "log_every": 10}


def measure(precision: str, attention_dropout: float | None, attention: str, steps: int, warmup: int, work: Path) -> dict:
    """Runs in a child process: train `steps` steps, then encode the corpus and the questions."""
    from taser.data.biencoder_json import BiEncoderJsonFile
    from taser.data.passages import read_passages
    from taser.data.qa import read_qa
    from taser.models.loading import load_model
    from taser.runtime import resolve_precision
    from taser.training.config import TrainConfig
    from taser.training.trainer import Trainer

    data = prepare_squad_with_bm25(work)
    precision = resolve_precision(precision)
    model, tokenizer = load_model({**MINILM_CLS, "attention_dropout": attention_dropout, "attention": attention})
    cfg = TrainConfig.from_value({**TRAIN, "max_steps": steps, "precision": precision})
    result = Trainer(model, tokenizer, [BiEncoderJsonFile(f) for f in data["train_files"]], cfg, work / f"timing-{precision}").train()
    passages = list(read_passages(data["passages"]))
    questions = [q.question for q in read_qa(data["qa_file"])]
    p_rate, q_rate = encode_rates(model, tokenizer, passages, questions, precision)
    return {
        "precision": precision,
        "attention_dropout": "0.1 (checkpoint)" if attention_dropout is None else attention_dropout,
        "attention": attention,
        "s_per_step": statistics.median(result.step_seconds[warmup:]),
        "steps_timed": len(result.step_seconds[warmup:]),
        "peak_gb": peak_rss_gb(),
        "passages_per_s": p_rate,
        "questions_per_s": q_rate,
    }


def accuracy_runs(work: Path, steps: int, precision: str) -> list:
    from taser.pipeline.experiment import evaluate_checkpoint, save_initial, train_and_evaluate

    data = prepare_squad_with_bm25(work)
    rate = 2400 / 6924  # one epoch = a seeded random 2,400 questions = 150 steps of 16
    train = {**TRAIN, "max_steps": steps, "precision": precision, "sampling_rates": [rate]}
    mean = {**MINILM_CLS, "pooling": "mean", "normalize": True}
    rows = [evaluate_checkpoint("zero-shot MiniLM (mean, normalised)", save_initial(mean, work / "zero-shot"), data, work / "zero-shot", precision=precision)]
    rows.append(train_and_evaluate("dpr, [CLS] pooling", MINILM_CLS, train, data, work / "acc-cls", eval_precision=precision))
    rows.append(train_and_evaluate("dpr, mean pooling (model's own)", mean, train, data, work / "acc-mean", eval_precision=precision))
    return rows


def _row(system: str, precision: str, dropout, attention: str, t: dict, ref: dict) -> str:
    cells = [system, precision, dropout, attention, f"{t['s_per_step']:.2f}", f"{ref['s_per_step'] / t['s_per_step']:.1f}x",
             f"{t['peak_gb']:.2f}", f"{t['passages_per_s']:.1f}", f"{t['questions_per_s']:.1f}"]
    return "| " + " | ".join(str(c) for c in cells) + " |"


def table(timings: list[dict], rows: list, args) -> str:
    ref = REFERENCE
    lines = [
        "| system | precision | attention dropout | attention | s/step (median) | steps/s vs reference | peak memory (GB) | passages/s | questions/s |",
        "|---|---|---|---|---|---|---|---|---|",
        _row("DPR reference code", "fp32", 0.1, "eager", ref, ref),
    ]
    lines += [_row("taser `dpr`", t["precision"], t["attention_dropout"], f"`{t['attention']}`", t, ref) for t in timings]
    out = "\n".join(lines) + "\n"
    out += "\nThe reference code's row was measured once on a CPU with native bf16 (AMD EPYC, AVX512-BF16) and is not re-run here.\n"
    if rows:
        from taser.pipeline.experiment import markdown_table

        r = ref["top_k"]
        out += (
            f"\nAccuracy on the 1,971 evaluation questions ({args.accuracy_steps} steps of 16, precision {args.accuracy_precision}); "
            f"DPR reference code ([CLS], fp32): top-1/5/20/100 {r['1']} / {r['5']} / {r['20']} / {r['100']}.\n\n"
        )
        out += markdown_table(rows)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", type=Path, default=ROOT / "outputs" / "bench-speed")
    ap.add_argument("--timing-steps", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--accuracy-steps", type=int, default=150)
    ap.add_argument("--precision", default="auto", help="comma-separated precisions to time (auto: from the hardware)")
    ap.add_argument("--accuracy-precision", default="auto")
    ap.add_argument("--skip-accuracy", action="store_true")
    ap.add_argument("--measure", help=argparse.SUPPRESS)
    ap.add_argument("--attention-dropout", type=float, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--attention", default="taser_sdpa", help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results.md")
    args = ap.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure, args.attention_dropout, args.attention, args.timing_steps, args.warmup, args.work)))
        return
    prepare_squad_with_bm25(args.work)
    timings = []
    # taser's default attention, then transformers' SDPA side by side (its CPU dropout path is unfused)
    attentions = ((None, "taser_sdpa"), (None, "sdpa"), (0.0, "sdpa"))
    settings = [(precision, *attention) for precision in args.precision.split(",") for attention in attentions]
    for precision, attention_dropout, attention in settings:
        extra = ["--attention", attention] + ([] if attention_dropout is None else ["--attention-dropout", str(attention_dropout)])
        timings.append(
            measure_in_child(__file__, precision, *extra, "--work", str(args.work), "--timing-steps", str(args.timing_steps), "--warmup", str(args.warmup))
        )
    rows = [] if args.skip_accuracy else accuracy_runs(args.work, args.accuracy_steps, args.accuracy_precision)
    title = "Speed against the DPR reference code (timing only)" if args.skip_accuracy else "Speed and accuracy against the DPR reference code"
    text = (
        f"# {title}\n\n"
        + f"Command: `{command_line(__file__)}` (timing: {args.timing_steps} steps, median after {args.warmup} warm-up steps).\n\n"
        + "\n".join(machine_line(p) for p in args.precision.split(","))
        + "\n\n"
        + table(timings, rows, args)
    )
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
