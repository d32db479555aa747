"""Which format of static int8 ONNX Runtime runs faster on this CPU (`onnx_int8_static`'s
`STATIC_FORMAT`, taser.models.onnx_backend): the passage graph of a checkpoint, fused, quantised
with activation ranges calibrated on the shipped calibration texts in each format (QOperator:
QLinearMatMul; QDQ: Quantize/Dequantize pairs ONNX Runtime fuses at load), against the dynamic int8
graph (`onnx_int8`) and the float32 one (`onnx`), in one process, interleaved: each round times
every graph once over the same length-sorted batches of 64 passages, as `encode_passages` builds
them; medians over rounds, and each graph's median cosine to the float32 graph's vectors.

    python benchmarks/peers/static_format.py --checkpoint outputs/bench-encode/models/zero-shot/initial
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from common import ROOT, command_line, machine_line  # noqa: E402
from profile_onnx import batches  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", type=Path, default=ROOT / "outputs" / "bench-encode" / "models" / "zero-shot" / "initial")
    ap.add_argument("--passages", type=Path, default=ROOT / "outputs" / "bench-encode" / "data" / "passages.tsv")
    ap.add_argument("--count", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    import numpy as np
    import onnxruntime as ort

    from taser.models.biencoder import BiEncoder, load_tokenizer
    from taser.models.onnx_backend import calibration_feeds, export_side, ffn_down_projections, fuse_transformer, quantize_int8, quantize_int8_static

    model = BiEncoder.load(args.checkpoint)
    enc = model.encoder_config
    feeds = list(batches(args.checkpoint, args.passages, args.count, 64))
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        export_side(model, "passage", tmp / "plain.onnx")
        fuse_transformer(tmp / "plain.onnx", tmp / "fp32.onnx", enc)
        keep = ffn_down_projections(tmp / "fp32.onnx", enc.intermediate_size, enc.hidden_size)
        quantize_int8(tmp / "fp32.onnx", tmp / "dynamic.onnx", keep)
        calibration = calibration_feeds(load_tokenizer(args.checkpoint), model.config, "passage")
        made = {}
        for fmt in ("QOperator", "QDQ"):
            start = time.perf_counter()
            quantize_int8_static(tmp / "fp32.onnx", tmp / f"static-{fmt}.onnx", calibration, keep, quant_format=fmt)
            made[fmt] = time.perf_counter() - start
        names = ["fp32", "dynamic", "static-QOperator", "static-QDQ"]
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.intra_op_num_threads = args.threads
        sessions = {n: ort.InferenceSession(str(tmp / f"{n}.onnx"), options, providers=["CPUExecutionProvider"]) for n in names}

        def run(name):
            return np.concatenate([sessions[name].run(["vectors"], {"input_ids": i, "attention_mask": m})[0] for i, m in feeds])

        vectors = {n: run(n) for n in names}  # also the warm-up
        seconds: dict[str, list[float]] = {n: [] for n in names}
        for _ in range(args.rounds):
            for n in names:
                start = time.perf_counter()
                run(n)
                seconds[n].append(time.perf_counter() - start)
    ref = vectors["fp32"]
    capability = f"CPU capability {__import__('torch').backends.cpu.get_cpu_capability()}"
    lines = [f"Command: `{command_line(__file__)}`", f"{machine_line('fp32')} {capability}.", f"{len(ref)} passages, batches of 64, {args.threads} threads, "
             f"{args.rounds} rounds; calibration (static) {made['QOperator']:.0f} s / {made['QDQ']:.0f} s", "",
             "| graph | passages/s (median) | per round | vs dynamic | median cosine to fp32 |", "|---|---|---|---|---|"]
    rate = {n: len(ref) / statistics.median(s) for n, s in seconds.items()}
    for n in names:
        v = vectors[n]
        cos = float(np.median((v * ref).sum(1) / (np.linalg.norm(v, axis=1) * np.linalg.norm(ref, axis=1))))
        lines.append(f"| {n} | {rate[n]:.1f} | {', '.join(f'{len(ref) / s:.1f}' for s in seconds[n])} | {rate[n] / rate['dynamic']:.2f}x | {cos:.5f} |")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
