"""One sentence-transformers encoding run, in the peer's own environment (`make peers-fast-env`:
sentence-transformers with its `onnx` and `openvino` extras, which need transformers 4.x, so they
cannot share taser's environment). Never imports taser. Called by `benchmarks/peers/encode.py`.

    .venv-peers-fast/bin/python benchmarks/peers/st_encode.py --setting onnx-int8 --model <dir> \
        --work <dir> --texts <dir> --out <dir> [--batch 64 --max-length 256]

Settings are the library's own CPU backends, each built with its own helpers, as its documentation
("Speeding up Inference") tells its users: `torch`; `onnx` (exported by `backend="onnx"`);
`onnx-O3` (`export_optimized_onnx_model(..., "O3")`: ONNX Runtime's transformer fusions and GELU
approximation); `onnx-int8` (`export_dynamic_quantized_onnx_model` with the configuration of this
CPU: avx512_vnni, avx512 or avx2); `openvino`; `openvino-int8` (static post-training int8 through
optimum-intel's `OVQuantizer`, the call `export_static_quantized_openvino_model` makes, calibrated
on 300 training questions and passages of the benchmark instead of GLUE's SST-2, which would need
the network). Each setting's export is built once into `--work/<setting>/` (its time recorded).

Prints one JSON line: load, export and encoding times, passages/s, questions/s, peak RSS; writes
`passages.npy`, `questions.npy` and (when given) the BEIR corpus and queries' vectors into `--out`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

SETTINGS = ("torch", "onnx", "onnx-O3", "onnx-int8", "openvino", "openvino-int8")
FILES = {
    "onnx": "onnx/model.onnx",
    "onnx-O3": "onnx/model_O3.onnx",
    "openvino": "openvino/openvino_model.xml",
    "openvino-int8": "openvino/openvino_model_qint8_quantized.xml",
}


def peak_rss_gb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024**2
    return 0.0


def cpu_quantization_config() -> str:
    """The int8 configuration sentence-transformers offers for this CPU's widest instructions."""
    flags = set()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    if "avx512_vnni" in flags or "avx512vnni" in flags:
        return "avx512_vnni"
    if "avx512f" in flags:
        return "avx512"
    return "avx2"


def file_of(setting: str, target: Path | None = None) -> str | None:
    if setting == "onnx-int8":  # model_<weights dtype>_<config>.onnx: qint8 or quint8 as the configuration chooses
        found = sorted((target / "onnx").glob(f"model_*int8_{cpu_quantization_config()}.onnx")) if target and (target / "onnx").is_dir() else []
        return f"onnx/{found[0].name}" if found else f"onnx/model_qint8_{cpu_quantization_config()}.onnx"
    return FILES.get(setting)


def backend_of(setting: str) -> str:
    return setting.split("-")[0]


def build(setting: str, source: str, target: Path, calibration: list[str]) -> float:
    """Export `source` for `setting` into `target` (once); the seconds it took (0 when reused)."""
    from sentence_transformers import SentenceTransformer

    if setting == "torch" or (target / file_of(setting, target)).is_file():
        return 0.0
    start = time.perf_counter()
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model = SentenceTransformer(source, device="cpu", backend=backend_of(setting))
    model.save_pretrained(str(tmp))  # the plain export (onnx/model.onnx or openvino/openvino_model.xml)
    if setting in ("onnx-O3", "onnx-int8", "openvino-int8"):
        model = SentenceTransformer(str(tmp), device="cpu", backend=backend_of(setting))
    if setting == "onnx-O3":
        from sentence_transformers import export_optimized_onnx_model

        export_optimized_onnx_model(model, "O3", str(tmp))
    elif setting == "onnx-int8":
        from sentence_transformers import export_dynamic_quantized_onnx_model

        export_dynamic_quantized_onnx_model(model, cpu_quantization_config(), str(tmp))
    elif setting == "openvino-int8":
        from datasets import Dataset
        from optimum.intel.openvino import OVConfig, OVQuantizationConfig, OVQuantizer

        quantizer = OVQuantizer.from_pretrained(model.transformers_model)
        encoded = model.tokenizer(calibration, padding="max_length", max_length=384, truncation=True)
        dataset = Dataset.from_dict(dict(encoded))
        quantizer.quantize(dataset, save_directory=str(tmp / "openvino-q"), ov_config=OVConfig(quantization_config=OVQuantizationConfig()))
        # sentence-transformers' own helper saves the quantised graph under this name beside the plain one
        quantised = next((tmp / "openvino-q").rglob("openvino_model.xml")).parent
        for suffix in ("xml", "bin"):
            shutil.copy(quantised / f"openvino_model.{suffix}", tmp / "openvino" / f"openvino_model_qint8_quantized.{suffix}")
        shutil.rmtree(tmp / "openvino-q")
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    return time.perf_counter() - start


def read_json(path: Path) -> list[str]:
    return json.loads(path.read_text())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--setting", choices=SETTINGS, required=True)
    ap.add_argument("--model", required=True, help="the sentence-transformers model directory (all-MiniLM-L6-v2)")
    ap.add_argument("--work", type=Path, required=True, help="where each setting's export is kept")
    ap.add_argument("--texts", type=Path, required=True, help="passages.json, questions.json, calibration.json [, beir-corpus.json, beir-queries.json]")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--max-length", type=int, default=256)
    ap.add_argument("--warmup", type=int, default=64, help="texts encoded once before timing")
    args = ap.parse_args()

    import numpy as np
    import torch
    from sentence_transformers import SentenceTransformer

    target = args.work / args.setting
    export_s = build(args.setting, args.model, target, read_json(args.texts / "calibration.json"))
    start = time.perf_counter()
    if args.setting == "torch":
        model = SentenceTransformer(args.model, device="cpu")
    else:
        model = SentenceTransformer(str(target), device="cpu", backend=backend_of(args.setting), model_kwargs={"file_name": file_of(args.setting, target)})
    model.max_seq_length = args.max_length
    load_s = time.perf_counter() - start
    passages, questions = read_json(args.texts / "passages.json"), read_json(args.texts / "questions.json")

    def encode(texts):
        return model.encode(texts, batch_size=args.batch, convert_to_numpy=True, normalize_embeddings=False).astype(np.float32)

    encode(passages[: args.warmup])
    start = time.perf_counter()
    p = encode(passages)
    passage_s = time.perf_counter() - start
    start = time.perf_counter()
    q = encode(questions)
    question_s = time.perf_counter() - start
    args.out.mkdir(parents=True, exist_ok=True)
    np.save(args.out / "passages.npy", p)
    np.save(args.out / "questions.npy", q)
    for name in ("beir-corpus", "beir-queries"):
        if (args.texts / f"{name}.json").is_file():
            np.save(args.out / f"{name}.npy", encode(read_json(args.texts / f"{name}.json")))
    import sentence_transformers

    print(json.dumps({
        "library": "sentence-transformers", "setting": args.setting, "file": file_of(args.setting, target),
        "export_s": export_s, "load_s": load_s, "passage_s": passage_s, "question_s": question_s,
        "passages_per_s": len(passages) / passage_s, "questions_per_s": len(questions) / question_s,
        "peak_rss_gb": peak_rss_gb(), "threads": torch.get_num_threads(),
        "versions": {"sentence_transformers": sentence_transformers.__version__, "torch": torch.__version__},
    }))


if __name__ == "__main__":
    main()
