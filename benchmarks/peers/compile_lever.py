"""The torch.compile lever: one training step of the peer benchmark's setting, eager vs the
encoder compiled by torch.compile (inductor), alternating, in one process; compile time counted.

    python benchmarks/peers/compile_lever.py [--steps 6] [--unpad false]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from common import BASE_TRAIN, ROOT, machine_line, prepare_squad_with_bm25  # noqa: E402
from run import BATCH, MAX_LENGTH, SCALE, taser_model, triplet_examples, triplets  # noqa: E402


def main() -> None:
    import torch

    from taser.training.batching import collate
    from taser.training.config import TrainConfig
    from taser.training.loss import retrieval_loss

    ap = argparse.ArgumentParser()
    ap.add_argument("--work", type=Path, default=ROOT / "outputs" / "bench-peers")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--unpad", choices=["true", "false"], default="false")
    args = ap.parse_args()
    data = prepare_squad_with_bm25(args.work)
    rows = triplets(data["train_files"][0], (2 * args.steps + 2) * BATCH, BASE_TRAIN["seed"])
    batches = [triplet_examples(rows[i * BATCH:(i + 1) * BATCH])
               for i in range(2 * args.steps + 2)]
    models = {}
    for name in ("eager", "compiled"):
        model, tokenizer = taser_model(args.unpad == "true")
        model.train()
        if name == "compiled":
            model.question_encoder = torch.compile(model.question_encoder, dynamic=True)
        optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5, fused=True)
        models[name] = (model, tokenizer, optimizer)
    loss_cfg = TrainConfig.from_value({**BASE_TRAIN, "temperature": 1 / SCALE}).loss_config(models["eager"][0].config)

    def step(name, examples):
        model, tokenizer, optimizer = models[name]
        b = collate(examples, tokenizer, MAX_LENGTH, MAX_LENGTH)
        start = time.perf_counter()
        out = model(b.questions, b.passages)
        nll, _ = retrieval_loss(out.questions, out.passages, b.positive_idx, b.ctx_owner, loss_cfg)
        nll.mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - start

    first = {name: step(name, batches[0]) for name in models}  # the compiled model's first step compiles
    second = {name: step(name, batches[1]) for name in models}  # a second length: a recompile if shapes are static
    times = {name: [] for name in models}
    for i in range(args.steps):
        for name in models:
            times[name].append(step(name, batches[2 + i]))
    print(machine_line())
    for name in models:
        print(f"{name}: first step {first[name]:.1f} s, second {second[name]:.1f} s, median of {args.steps} after: {statistics.median(times[name]):.2f} s/step")
    print(f"compiled vs eager: {statistics.median(times['eager']) / statistics.median(times['compiled']):.2f}x step rate")


if __name__ == "__main__":
    main()
