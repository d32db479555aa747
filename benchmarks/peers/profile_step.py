"""Where one training step of the peer benchmark's setting goes: torch.profiler's top operators
by self CPU time, for one forward + backward + optimizer step after two warm-up steps.

    python benchmarks/peers/profile_step.py [--unpad true|false] [--rows 15]

Batch building (tokenisation and collation) is timed separately, outside the profile.
"""

from __future__ import annotations

import argparse
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
    from torch.profiler import ProfilerActivity, profile

    from taser.training.batching import collate
    from taser.training.config import TrainConfig
    from taser.training.loss import retrieval_loss

    ap = argparse.ArgumentParser()
    ap.add_argument("--work", type=Path, default=ROOT / "outputs" / "bench-peers")
    ap.add_argument("--unpad", choices=["true", "false"], default="true")
    ap.add_argument("--rows", type=int, default=15)
    args = ap.parse_args()
    data = prepare_squad_with_bm25(args.work)
    model, tokenizer = taser_model(args.unpad == "true")
    model.train()
    loss_cfg = TrainConfig.from_value({**BASE_TRAIN, "temperature": 1 / SCALE}).loss_config(model.config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5, fused=True)  # as the trainer
    rows = triplets(data["train_files"][0], 4 * BATCH, BASE_TRAIN["seed"])

    def batch(i):
        examples = triplet_examples(rows[i * BATCH:(i + 1) * BATCH])
        return collate(examples, tokenizer, MAX_LENGTH, MAX_LENGTH)

    def step(b):
        out = model(b.questions, b.passages)
        nll, _ = retrieval_loss(out.questions, out.passages, b.positive_idx, b.ctx_owner, loss_cfg)
        nll.mean().backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for i in range(2):
        step(batch(i))
    start = time.perf_counter()
    b = batch(2)
    build_s = time.perf_counter() - start
    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step(b)
    step_s = time.perf_counter() - start
    print(machine_line())
    print(f"unpad={args.unpad}: batch building {1000 * build_s:.1f} ms; step {step_s:.2f} s (profiled); "
          f"tokens: {int(b.questions['attention_mask'].sum())} question + {int(b.passages['attention_mask'].sum())} passage real, "
          f"{b.questions['attention_mask'].numel()} + {b.passages['attention_mask'].numel()} padded")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))


if __name__ == "__main__":
    main()
