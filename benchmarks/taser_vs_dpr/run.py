"""DPR vs TASER on the shipped SQuAD benchmark from the shipped MiniLM (issue 3).

    python benchmarks/taser_vs_dpr/run.py --steps 60 --batch 16

Rows: zero-shot, `shared`, `dpr`, `taser` (T=2, deterministic) and TASER with learned sequence
routing, each trained with the same data (1 BM25 hard negative per question), steps, batch and
seed; [CLS]-free: every model uses MiniLM's own mean pooling and normalisation.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import BASE_TRAIN, ROOT, command_line, machine_line, prepare_squad_with_bm25  # noqa: E402

TASER = {"specialize_every": 2, "specialize": "ffn", "routing": "deterministic", "num_experts": 2}
# (row name, directory under --work, model settings)
MODELS = [
    ("shared", "shared", {"model_type": "shared"}),
    ("dpr", "dpr", {"model_type": "dpr"}),
    ("taser (T=2, deterministic)", "taser", {"model_type": "taser", "taser": TASER}),
    (
        "taser (T=2, learned sequence routing)",
        "taser-seq",
        {"model_type": "taser", "taser": {**TASER, "routing": "learned_sequence", "load_balance_weight": 0.01}},
    ),
]


def main() -> None:
    from taser.pipeline.experiment import evaluate_checkpoint, markdown_table, save_initial, train_and_evaluate

    ap = argparse.ArgumentParser()
    ap.add_argument("--work", type=Path, default=ROOT / "outputs" / "bench-taser")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--train-precision", default="auto")
    ap.add_argument("--eval-precision", default="auto")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results.md")
    args = ap.parse_args()
    start = time.perf_counter()
    data = prepare_squad_with_bm25(args.work)
    base = {"pretrained": "shipped:all-MiniLM-L6-v2", "pooling": "auto", "normalize": "auto"}
    train = {
        **BASE_TRAIN,
        "batch_size": args.batch,
        "learning_rate": args.lr,
        "warmup_steps": max(1, args.steps // 10),
        "max_steps": args.steps,
        "precision": args.train_precision,
    }
    rows = [
        evaluate_checkpoint(
            "zero-shot (MiniLM)",
            save_initial({**base, "model_type": "shared"}, args.work / "zero-shot"),
            data,
            args.work / "zero-shot",
            precision=args.eval_precision,
        )
    ]
    for name, slug, model in MODELS:
        rows.append(train_and_evaluate(name, {**base, **model}, train, data, args.work / slug, eval_precision=args.eval_precision))
        print(markdown_table(rows), flush=True)
    total = time.perf_counter() - start
    text = (
        "# DPR vs TASER on the SQuAD benchmark (shipped data, all-MiniLM-L6-v2)\n\n"
        f"Command: `{command_line(__file__)}`\n\n"
        f"{machine_line(args.train_precision)} Encoding: {machine_line(args.eval_precision).split('; ')[-1]}\n\n"
        f"Budget: {args.steps} steps of {args.batch} questions, each with its positive and 1 BM25 hard negative (in-batch negatives), "
        f"lr {args.lr}, seed 12345; mean pooling, normalised (MiniLM's own). "
        f"Whole run: {total / 60:.1f} min. Evaluation: 1,971 questions of the last 10 articles over 2,141 passages.\n\n" + markdown_table(rows)
    )
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
