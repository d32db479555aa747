"""Where OpenVINO spends the time: taser's OpenVINO models against sentence-transformers' exports,
the same batch through the same OpenVINO Runtime, with per-operation profiling (issue 49).

    python benchmarks/peers/profile_openvino.py            # after benchmarks/peers/encode.py (it uses that run's models)

Every model is compiled here, in this environment's OpenVINO, with the latency hint and all cores;
taser's with the precision its backend states, sentence-transformers' with OpenVINO's defaults as
its own loader leaves them (on a CPU with native bf16: bf16). One batch of 64 passages from the
middle of taser's length order (the lengths every batch of a length-sorted run sees), tokenised once
and fed to all. Per model: the median of 20 timed inferences after 3 warm-ups, and the share of the
profiled time by operation type (OpenVINO's `PERF_COUNT`, `real_time` of executed nodes). Writes
`benchmarks/peers/profile_openvino.md`.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from common import ROOT, command_line, machine_line  # noqa: E402


def models(work: Path) -> list[tuple[str, Path, str | None]]:
    """(name, IR file, stated inference precision or None for OpenVINO's default) of the models the encode run left."""
    taser = work / "models" / "zero-shot" / "initial" / ".backends"
    st = work / "st-exports"
    return [
        ("taser `openvino` (f32 stated)", taser / "openvino" / "passage.xml", "f32"),
        ("taser `openvino_bf16` (bf16 stated)", taser / "openvino_bf16" / "passage.xml", "bf16"),
        ("taser `openvino_int8` (int8, f32 stated)", taser / "openvino_int8" / "passage.xml", "f32"),
        ("sentence-transformers `openvino` (default)", st / "openvino" / "openvino" / "openvino_model.xml", None),
        ("sentence-transformers `openvino-int8` (default)", st / "openvino-int8" / "openvino" / "openvino_model_qint8_quantized.xml", None),
    ]


def batch(work: Path, size: int):
    """One batch of `size` passages from the middle of the length order, as int64 input_ids and attention_mask."""
    import json

    import numpy as np
    from transformers import AutoTokenizer

    from taser.models.pretrained import SHIPPED_MODEL, resolve_pretrained

    tokenizer = AutoTokenizer.from_pretrained(resolve_pretrained(SHIPPED_MODEL))
    pairs = json.loads((work / "texts" / "passages.pairs.json").read_text())
    encoded = [tokenizer(title, text, truncation=True, max_length=256)["input_ids"] for title, text in pairs]
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
    middle = order[len(order) // 2 - size // 2:][:size]
    width = max(len(encoded[i]) for i in middle)
    ids = np.zeros((size, width), dtype=np.int64)
    mask = np.zeros((size, width), dtype=np.int64)
    for row, i in enumerate(middle):
        ids[row, : len(encoded[i])] = encoded[i]
        mask[row, : len(encoded[i])] = 1
    return ids, mask


def profile(path: Path, precision: str | None, ids, mask, rounds: int) -> dict:
    import numpy as np
    import openvino as ov
    import torch

    config = {"PERF_COUNT": True, "PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": torch.get_num_threads()}
    if precision:
        config["INFERENCE_PRECISION_HINT"] = precision
    compiled = ov.Core().compile_model(str(path), "CPU", config)
    names = {port.get_any_name() for port in compiled.inputs}
    feed = {"input_ids": ids, "attention_mask": mask}
    if "token_type_ids" in names:
        feed["token_type_ids"] = np.zeros_like(ids)
    request = compiled.create_infer_request()
    for _ in range(3):
        request.infer(feed)
    times, shares = [], collections.Counter()
    for _ in range(rounds):
        start = time.perf_counter()
        request.infer(feed)
        times.append(time.perf_counter() - start)
        for node in request.profiling_info:
            if node.status == node.Status.EXECUTED:
                shares[node.node_type] += node.real_time.total_seconds()
    total = sum(shares.values())
    return {"ms": 1000 * statistics.median(times), "precision": compiled.get_property("INFERENCE_PRECISION_HINT").to_string(),
            "shares": {k: v / total for k, v in shares.most_common()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=ROOT / "outputs" / "bench-encode", help="benchmarks/peers/encode.py's --work")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--out", type=Path, default=HERE / "profile_openvino.md")
    args = ap.parse_args()
    found = [(name, path, precision) for name, path, precision in models(args.work) if path.is_file()]
    if not found:
        raise SystemExit(f"no OpenVINO models under {args.work}: run benchmarks/peers/encode.py first")
    ids, mask = batch(args.work, args.batch)
    results = {name: profile(path, precision, ids, mask, args.rounds) for name, path, precision in found}
    fastest = min(r["ms"] for r in results.values())
    lines = ["# OpenVINO, operation by operation: taser's models against sentence-transformers' exports\n",
             f"From `{command_line(__file__)}`: {machine_line('fp32').rstrip('.')}; one batch of {args.batch} passages, "
             f"{ids.shape[1]} tokens wide (the middle of the length order), the median of {args.rounds} inferences.\n",
             "| model | inference precision | ms per batch | vs the fastest | top operation types (share of profiled time) |",
             "|---|---|---|---|---|"]
    for name, r in results.items():
        top = ", ".join(f"{k} {100 * v:.1f}%" for k, v in list(r["shares"].items())[:6])
        lines.append(f"| {name} | {r['precision']} | {r['ms']:.1f} | {r['ms'] / fastest:.2f}x | {top} |")
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
