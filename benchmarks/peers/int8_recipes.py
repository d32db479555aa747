"""Which int8 recipe `backend=openvino_int8` uses (issue 49): NNCF candidates judged by how often
they move a question's first hit away from taser's `torch`, on questions the accuracy gate never reads.

    python benchmarks/peers/int8_recipes.py                 # every candidate on the trained dpr and taser, ~30 min on 2 cores alone
    python benchmarks/peers/int8_recipes.py --report-only   # int8_recipes.md again from the run's int8_recipes.json

The gate (`benchmarks/peers/encode.py`) decides a recipe over the 8,981 shipped SQuAD questions; a
recipe chosen by its outcomes there would be judged on the questions it was fitted to. So the choice
reads another set: the 3,610 NQ-open and 694 CuratedTREC test questions of `tests/fixtures/` (4,304,
no SQuAD question among them) against the SQuAD protocol's 2,141 passages, and counts the questions
whose first passage differs from `torch`'s (no answer is needed to see that two encoders of one model
disagree). Each candidate converts the trained `dpr` and `taser` (T=2) of the encode benchmark
(`--work`, trained there when absent) with taser's own conversion, quantises them with
`taser.models.openvino_backend.quantize_int8` on the shipped calibration texts, and encodes in
OpenVINO with the int8 backend's stated precision (float32 for what stays float).

The rule, fixed before the run: the candidate with the fewest moved first hits on the selection set,
summed over the two models; within 2% of that, the one with fewer products in float (they cost speed).

The candidates vary the two choices of the recipe: SmoothQuant's alpha for the matrix products
(NNCF's default for transformers is 0.95) and which products stay in float. The table also shows,
for each candidate, the questions of the gate's set whose top-1 outcome (DPR's answer match)
differs from `torch`'s: shown, not read by the choice. The gate needs at most about 192 of them per
checked model to detect a 0.5-point loss (docs/encoding.md, "The accuracy gate").
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from common import ROOT, command_line, machine_line  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures"
SELECTION_FILES = ("nq-test.qa.tsv", "curatedtrec-test.qa.tsv")
FIRST_FFN_OUTPUT = r"\.encoder\.layer\.0\.output\.(?:experts\.\d+\.output\.)?dense/"
# name: (SmoothQuant alpha of the matrix products, the products left in float: a pattern of their names, or None)
CANDIDATES = {
    "recipe 1: NNCF's transformer defaults": (0.95, None),
    "SmoothQuant 0.85": (0.85, None),
    "first FFN output in float": (0.95, FIRST_FFN_OUTPUT),
    "first FFN in float": (0.95, r"\.encoder\.layer\.0\.(?:intermediate|output)\..*dense/"),
    "first FFN output in float, SmoothQuant 0.85": (0.85, FIRST_FFN_OUTPUT),
    "first FFN output in float, SmoothQuant 0.75": (0.75, FIRST_FFN_OUTPUT),
}


def selection_questions() -> list[str]:
    from taser.data.qa import read_qa

    return [x.question for name in SELECTION_FILES for x in read_qa(FIXTURES / name)]


def encode_all(model, tokenizer, passages, question_sets: dict[str, list[str]]):
    from taser.models.encoding import encode_passages, encode_questions

    kw = {"batch_size": 64, "precision": "fp32"}
    return encode_passages(model, tokenizer, passages, **kw), {k: encode_questions(model, tokenizer, v, **kw) for k, v in question_sets.items()}


def candidate_encoder(checkpoint: Path, alpha: float, keep_float: str | None, root: Path):
    """The checkpoint's two sides quantised by this candidate, compiled as `openvino_int8` compiles."""
    import openvino as ov
    from transformers import AutoConfig

    from taser.models.biencoder import BiEncoder, load_tokenizer, read_checkpoint_config
    from taser.models.graph_cache import SIDES
    from taser.models.onnx_backend import calibration_feeds
    from taser.models.openvino_backend import OpenVinoEncoder, convert_side, float_matmuls, quantize_int8
    from taser.models.params import parameter_report

    model, tokenizer = BiEncoder.load(checkpoint), load_tokenizer(checkpoint)
    pattern = re.compile(keep_float) if keep_float else None
    kept = 0
    for side in SIDES:
        converted = convert_side(model, side)
        kept += len(float_matmuls(converted, pattern)) if pattern else 0
        ov.save_model(quantize_int8(converted, calibration_feeds(tokenizer, model.config, side), alpha, pattern), str(root / f"{side}.xml"),
                      compress_to_fp16=False)  # fmt: skip
    config, raw = read_checkpoint_config(checkpoint)
    return OpenVinoEncoder(config, AutoConfig.for_model(**raw), root, "openvino_int8", parameter_report(model)), tokenizer, kept


def main() -> None:
    import numpy as np
    from encode import TRAINED, AnswerCache, prepare

    from taser.data.passages import Passage
    from taser.models.loading import load_checkpoint

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=ROOT / "outputs" / "bench-encode")
    ap.add_argument("--candidates", nargs="+", default=list(CANDIDATES), choices=list(CANDIDATES))
    ap.add_argument("--out", type=Path, default=HERE / "int8_recipes.md")
    ap.add_argument("--record", type=Path, default=HERE / "int8_recipes.json", help="the run's rows, which --report-only reads")
    ap.add_argument("--report-only", action="store_true")
    args = ap.parse_args()
    if args.report_only:
        args.out.write_text(report(json.loads(args.record.read_text())))
        return
    args.limit, args.dpr, args.taser, args.train_steps = None, None, None, 50  # encode.py's prepare: its full texts and trained models
    prepared = prepare(args)
    texts = args.work / "texts"
    pairs = json.loads((texts / "passages.pairs.json").read_text())
    passages = [Passage(str(i), text, title) for i, (title, text) in enumerate(pairs)]
    question_sets = {"selection": selection_questions(), "gate": json.loads((texts / "questions.json").read_text())}
    answers = AnswerCache(prepared["qa"], prepared["passages"])

    def first_hits(p, q):
        return np.argmax(q @ p.T, axis=1)

    rows, started = [], time.perf_counter()
    for name in TRAINED:
        checkpoint = Path(prepared["models"][name])
        reference = encode_all(*load_checkpoint(checkpoint, device="cpu", backend="torch"), passages, question_sets)
        hits = {k: first_hits(reference[0], q) for k, q in reference[1].items()}
        correct = np.array([answers(i, int(j)) for i, j in enumerate(hits["gate"])])
        for candidate in args.candidates:
            alpha, keep_float = CANDIDATES[candidate]
            with tempfile.TemporaryDirectory() as tmp:
                encoder, tokenizer, kept = candidate_encoder(checkpoint, alpha, keep_float, Path(tmp))
                p, qs = encode_all(encoder, tokenizer, passages, question_sets)
            moved = {k: int((first_hits(p, q) != hits[k]).sum()) for k, q in qs.items()}
            outcome = np.array([answers(i, int(j)) for i, j in enumerate(first_hits(p, qs["gate"]))])
            row = {"model": name, "candidate": candidate, "alpha": alpha, "float_products": kept, "selection_moved": moved["selection"],
                   "gate_moved": moved["gate"], "gate_discordant": int((outcome != correct).sum())}  # fmt: skip
            rows.append(row)
            print(json.dumps(row), flush=True)
    record = {"rows": rows, "selection": len(question_sets["selection"]), "gate": len(question_sets["gate"]), "command": command_line(__file__),
              "machine": machine_line("fp32"), "date": time.strftime("%Y-%m-%d"), "minutes": round((time.perf_counter() - started) / 60)}  # fmt: skip
    args.record.write_text(json.dumps(record, indent=1) + "\n")
    args.out.write_text(report(record))


def rule_pick(rows: list[dict]) -> str:
    """The candidate with the fewest moved first hits on the selection set summed over the models; within
    2% of that, the one with the fewest products in float (they cost speed), then the fewest moved."""
    moved, kept = {}, {}
    for r in rows:
        moved[r["candidate"]] = moved.get(r["candidate"], 0) + r["selection_moved"]
        kept[r["candidate"]] = kept.get(r["candidate"], 0) + r["float_products"]
    best = min(moved.values())
    return min((c for c in moved if moved[c] <= 1.02 * best), key=lambda c: (kept[c], moved[c]))


def report(record: dict) -> str:
    from taser.models.openvino_backend import FLOAT_MATMULS, SMOOTH_QUANT_ALPHA

    rows, selection, gate = record["rows"], record["selection"], record["gate"]
    chosen = next((c for c, (a, f) in CANDIDATES.items() if a == SMOOTH_QUANT_ALPHA and f == FLOAT_MATMULS.pattern), None)
    picked = rule_pick(rows)
    models = list(dict.fromkeys(r["model"] for r in rows))
    by = {(r["candidate"], r["model"]): r for r in rows}
    lines = ["# int8 recipes of `openvino_int8`: first hits moved against `torch`", "",
             f"`{record['command']}`, {record['date']}, {record['minutes']} min. {record['machine']}", "",
             *([f"Run: {record['note']}.", ""] if record.get("note") else []),
             __doc__.split("\n\n", 2)[2].strip(), "",
             f"Selection set: {selection:,} questions (NQ-open and CuratedTREC test). Gate set: {gate:,} SQuAD questions (shown, not read by the choice).",
             f"The rule picks **{picked}**; `openvino_int8` uses **{chosen or 'none of these candidates'}**.", "",
             "| candidate | SmoothQuant alpha | products in float | "
             + " | ".join(f"{m}: selection moved | {m}: gate moved | {m}: gate top-1 differs" for m in models) + " |",
             "|---|---|---|" + "---|---|---|" * len(models)]  # fmt: skip
    for candidate in dict.fromkeys(r["candidate"] for r in rows):
        cells = []
        for m in models:
            r = by.get((candidate, m))
            cells += [str(r["selection_moved"]), str(r["gate_moved"]), str(r["gate_discordant"])] if r else ["", "", ""]
        kept = {by[(candidate, m)]["float_products"] for m in models if (candidate, m) in by}
        mark = " (chosen)" if candidate == chosen else ""
        lines.append(f"| {candidate}{mark} | {CANDIDATES[candidate][0]} | {'/'.join(map(str, sorted(kept)))} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
