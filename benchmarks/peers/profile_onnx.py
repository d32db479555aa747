"""Where ONNX Runtime spends a passage encoding, per operator type, for taser's ONNX backends'
graphs (`--backends`, by default every one; ONNX Runtime's own profiler), on the protocol's
passages in length-sorted batches of 64 as `encode_passages` builds them.

    python benchmarks/peers/profile_onnx.py --checkpoint outputs/bench-encode/models/zero-shot/initial
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from common import ROOT, command_line, machine_line  # noqa: E402


def batches(checkpoint: Path, passages_tsv: Path, count: int, size: int):
    from taser.data.passages import read_passages
    from taser.models.biencoder import load_tokenizer
    from taser.models.inputs import pad_batch, passage_ids

    tokenizer = load_tokenizer(checkpoint)
    passages = [p for _, p in zip(range(count), read_passages(passages_tsv))]
    ids = sorted(passage_ids(tokenizer, [p.title for p in passages], [p.text for p in passages], 256), key=len, reverse=True)
    for b in range(0, len(ids), size):
        batch = pad_batch(ids[b : b + size], tokenizer.pad_token_id)
        yield batch["input_ids"].numpy(), batch["attention_mask"].numpy()


def profile(graph: Path, feeds: list, threads: int) -> dict[str, float]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads
    options.enable_profiling = True
    session = ort.InferenceSession(str(graph), options, providers=["CPUExecutionProvider"])
    for input_ids, mask in feeds:
        session.run(None, {"input_ids": input_ids, "attention_mask": mask})
    trace = Path(session.end_profiling())
    per_op: collections.Counter = collections.Counter()
    for event in json.loads(trace.read_text()):
        if event.get("cat") == "Node" and event.get("name", "").endswith("_kernel_time"):
            per_op[event["args"]["op_name"]] += event["dur"]
    trace.unlink()
    total = sum(per_op.values())
    return {op: 100 * t / total for op, t in per_op.most_common()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkpoint", type=Path, default=ROOT / "outputs" / "bench-encode" / "models" / "zero-shot" / "initial")
    ap.add_argument("--passages", type=Path, default=ROOT / "outputs" / "bench-encode" / "data" / "passages.tsv")
    ap.add_argument("--count", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--backends", nargs="+", default=None, help="ONNX backends to profile (default: all of taser.models.backends.ONNX_BACKENDS)")
    ap.add_argument("--out", type=Path, default=HERE / "profile_onnx.md")
    args = ap.parse_args()
    import torch

    from taser.models.backends import ONNX_BACKENDS
    from taser.models.onnx_backend import prepare_graphs

    feeds = list(batches(args.checkpoint, args.passages, args.count, 64))
    capability = f"CPU capability {torch.backends.cpu.get_cpu_capability()}"
    lines = [f"# Where ONNX Runtime spends a passage encoding\n\nCommand: `{command_line(__file__)}`\n\n{machine_line('fp32')} {capability}.\n\n"
             f"{args.count} passages, length-sorted batches of 64, {args.threads} threads; share of the kernels' time per operator type.\n"]
    for backend in args.backends or ONNX_BACKENDS:
        shares = profile(prepare_graphs(args.checkpoint, backend) / "passage.onnx", feeds, args.threads)
        lines.append(f"\n## `{backend}`\n\n| operator | share of kernel time |\n|---|---|")
        lines += [f"| {op} | {share:.1f}% |" for op, share in list(shares.items())[:12]]
    text = "\n".join(lines) + "\n"
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
