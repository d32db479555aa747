"""Peak memory of the paper's batch (128 questions, each with a positive and a BM25 hard negative)
with and without gradient caching (issue 5), on this machine (2 cores, ~23 GB).

    python benchmarks/grad_cache/run.py

Models: the shipped MiniLM (`dpr`, two 22.7M encoders) and a BERT-base-sized `dpr` (two 110M
encoders, random weights: memory does not depend on the values). Max 256 tokens, [CLS],
precision `auto` (bf16 where the CPU has it natively, else fp32) unless --precision is given.
Each variant trains `--steps` steps in its own process, so each peak is its own. The plain step
at BERT-base size is not run: its activations alone would exceed this machine's memory.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import BASE_TRAIN, MINILM_CLS, ROOT, command_line, machine_line, measure_in_child, peak_rss_gb, prepare_squad_with_bm25  # noqa: E402

TRAIN = {**BASE_TRAIN, "batch_size": 128, "warmup_steps": 1, "log_every": 1}


def bert_base(work: Path) -> str:
    """A randomly initialised BERT-base (768 x 12 layers) with MiniLM's (= bert-base-uncased's) vocabulary."""
    path = work / "bert-base-random"
    if not (path / "config.json").is_file():
        import torch
        from transformers import BertConfig, BertModel

        from taser.models.biencoder import load_tokenizer

        torch.manual_seed(0)
        tokenizer = load_tokenizer("shipped:all-MiniLM-L6-v2")
        BertModel(BertConfig(vocab_size=tokenizer.vocab_size)).save_pretrained(path)
        tokenizer.save_pretrained(path)
    return str(path)


def measure(model_name: str, chunk: int, steps: int, precision: str, work: Path) -> dict:
    from taser.data.biencoder_json import BiEncoderJsonFile
    from taser.models.loading import load_model
    from taser.training.config import TrainConfig
    from taser.training.trainer import Trainer

    data = prepare_squad_with_bm25(work)
    pretrained = MINILM_CLS["pretrained"] if model_name == "MiniLM" else bert_base(work)
    model, tokenizer = load_model({**MINILM_CLS, "pretrained": pretrained})
    cfg = TrainConfig.from_value({**TRAIN, "max_steps": steps, "grad_cache_chunk": chunk, "precision": precision})
    result = Trainer(model, tokenizer, [BiEncoderJsonFile(f) for f in data["train_files"]], cfg, work / f"{model_name}-{chunk}").train()
    return {
        "model": model_name,
        "parameters": sum(p.numel() for p in model.parameters()),
        "grad_cache_chunk": chunk,
        "steps": steps,
        "s_per_step": statistics.median(result.step_seconds),
        "peak_gb": peak_rss_gb(),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", type=Path, default=ROOT / "outputs" / "bench-grad-cache")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--chunk", type=int, default=32)
    ap.add_argument("--precision", default="auto", help="auto: from the hardware (taser.runtime)")
    ap.add_argument("--measure", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results.md")
    args = ap.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure[0], int(args.measure[1]), args.steps, args.precision, args.work)))
        return
    prepare_squad_with_bm25(args.work)
    bert_base(args.work)
    rows = []
    for model_name, chunk in (("MiniLM", 0), ("MiniLM", args.chunk), ("BERT-base", args.chunk)):
        rows.append(measure_in_child(__file__, model_name, str(chunk), "--steps", str(args.steps), "--precision", args.precision, "--work", str(args.work)))
    lines = [
        "# Gradient caching: the paper's batch of 128 on one CPU machine",
        "",
        f"Command: `{command_line(__file__)}`. Batch 128 questions + 128 positives + 128 BM25 hard negatives",
        f"(in-batch negatives across all 256 passages), max 256 tokens, {args.steps} training steps per row (median s/step), each row in its own process.",
        "",
        machine_line(args.precision),
        "",
        "| model | parameters | gradient cache chunk | peak memory (GB) | s/step |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        chunk = "off (plain step)" if r["grad_cache_chunk"] == 0 else f"{r['grad_cache_chunk']} sequences"
        lines.append(f"| `dpr` {r['model']} | {r['parameters'] / 1e6:.1f}M | {chunk} | {r['peak_gb']:.2f} | {r['s_per_step']:.1f} |")
    text = "\n".join(lines) + "\n"
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
