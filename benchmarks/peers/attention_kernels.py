"""The attention core alone, forward + backward, at a training step's passage shape: how far the
library's kernel with dropout is from the matrix-product rate, and from PyTorch's fused CPU
attention, which has no dropout (issue 35: what the roofline's remaining gap is made of).

    python benchmarks/peers/attention_kernels.py --isa avx2      # [32, 12, 130, 32], dropout 0.1, ~1 min

Settings, each run in turn in one process, the order alternating from round to round:
- `taser chunked, dropout`: `taser.models.attention.chunked_dropout_attention` (the library's kernel
  in CPU training with attention dropout);
- `torch math, dropout`: the unfused softmax(q k^T) -> dropout -> x v, what PyTorch's SDPA runs on
  CPU when given a dropout;
- `torch SDPA, no dropout`: PyTorch's fused CPU kernel, which takes no dropout (not equal maths: the
  bound a fused kernel with dropout could approach).

Inputs are fp32, a padding mask masks the last 10 keys of every sequence. The useful FLOPs are
3 x 4 B H L^2 D (q k^T and the probabilities times v, forward; backward twice that); the GEMM
rate is `roofline.py`'s, at [B L, 384] x [384, 1536], measured before and after.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from roofline import ISA_ENV  # noqa: E402


def settings(p: float) -> dict:
    import torch.nn.functional as F

    from taser.models.attention import chunked_dropout_attention

    def math(q, k, v, mask):
        probs = (q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5).masked_fill(~mask, float("-inf")).softmax(-1)
        return F.dropout(probs, p, training=True) @ v

    return {
        "taser chunked, dropout": lambda q, k, v, mask: chunked_dropout_attention(q, k, v, mask, p),
        "torch math, dropout": math,
        "torch SDPA, no dropout": lambda q, k, v, mask: F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--isa", choices=["native", *ISA_ENV], default="native")
    ap.add_argument("--shape", type=int, nargs=4, default=[32, 12, 130, 32], metavar=("B", "H", "L", "D"))
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--rounds", type=int, default=12)
    args = ap.parse_args()
    os.environ.update(ISA_ENV.get(args.isa, {}))  # before torch loads
    import torch
    from common import command_line, machine_line
    from roofline import gemm_rate

    from taser.runtime import keep_freed_memory

    keep_freed_memory()  # as in CPU training
    kernels = settings(args.dropout)
    b, h, length, d = args.shape
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(b, h, length, d, generator=gen, requires_grad=True) for _ in range(3))
    mask = torch.ones(b, 1, length, length, dtype=torch.bool)
    mask[..., length - 10:] = False

    def once(fn) -> float:
        start = time.perf_counter()
        fn(q, k, v, mask).sum().backward()
        return time.perf_counter() - start

    for fn in kernels.values():
        once(fn)
    rate_before = gemm_rate(b * length, h * d, 4 * h * d, torch.float32)
    times = {name: [] for name in kernels}
    names = list(kernels)
    for r in range(args.rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            times[name].append(once(kernels[name]))
    rate = (rate_before + gemm_rate(b * length, h * d, 4 * h * d, torch.float32)) / 2
    flops = 3 * 4 * b * h * length * length * d
    print(f"{machine_line('fp32')}; ISA: {args.isa} (torch dispatch: {torch.backends.cpu.get_cpu_capability()}), threads {torch.get_num_threads()}")
    print(f"shape [B, H, L, D] = {args.shape}, dropout {args.dropout}, {flops / 1e9:.2f} GFLOP useful, GEMM rate {rate / 1e9:.0f} GFLOP/s; "
          f"{args.rounds} rounds\n")
    print("| setting | forward + backward ms (median) | GFLOP/s | fraction of the GEMM rate | vs taser chunked (paired by round) |")
    print("|---|---|---|---|---|")
    first = times[names[0]]
    for name in names:
        ms = statistics.median(times[name]) * 1e3
        ratio = statistics.median(a / t for a, t in zip(first, times[name]))
        print(f"| {name} | {ms:.1f} | {flops / ms / 1e6:.0f} | {100 * flops / ms / 1e6 / (rate / 1e9):.0f}% | {ratio:.2f}x |")
    print(f"\n{command_line(__file__)}")


if __name__ == "__main__":
    main()
