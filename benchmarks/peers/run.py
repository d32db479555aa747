"""taser against sentence-transformers, the library researchers would pick instead, side by side.

    python benchmarks/peers/run.py                # 3 pairs A B A B A B, ~25 min on 2 cores
    python benchmarks/peers/run.py --pairs 1 --steps 6 --warmup 2   # a quick look

Both train the shipped all-MiniLM-L6-v2 (mean pooling, unit vectors, cosine) with in-batch plus
one BM25 hard negative per question (sentence-transformers' MultipleNegativesRankingLoss, scale
20; taser's `shared` model, temperature 0.05 = 1/20) on the SQuAD benchmark's mined file: batch
16 questions + 16 positives + 16 hard negatives, max 256 tokens, lr 2e-5 (linear decay after 2
warm-up steps), clip 1.0, dropout as the checkpoint's (0.1), precision `auto` on both. Each run
is its own process (peak memory is its own), alternating the two libraries. A step is timed from
one step's end to the next (batch building included, for both). After training, each encodes the
2,141 passages and the dev questions (its own encode, batch 64) and scores top-1/5 by exact
search, so equal learning is shown with the same steps.

Before any timing: equal maths. With dropout off and the same weights, both libraries compute
the loss of the same first batch (same questions, positives and hard negatives); they must agree
to float tolerance.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from common import BASE_TRAIN, ROOT, command_line, machine_line, prepare_squad_with_bm25, write_keeping_section  # noqa: E402

BATCH, LR, WARMUP_STEPS, SCALE, MAX_LENGTH = 16, 2e-5, 2, 20.0, 256
LEVERS = "## Levers"


def hwm_gb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024**2
    return 0.0


def triplets(train_file: str, count: int, seed: int) -> list[tuple[str, str, str]]:
    """(question, positive, hard negative) of the first `count` records, the hard negative drawn
    as taser's epoch 0 draws it, and passages as taser tokenises them (`title [SEP] text`)."""
    from taser.data.biencoder_json import BiEncoderJsonFile
    from taser.models.inputs import passage_string
    from taser.training.batching import example_rng, make_example

    source = BiEncoderJsonFile(train_file)
    out = []
    for i in range(min(count, len(source))):
        example = make_example(source[i], 1, 0, example_rng(seed, 0, 0, i))
        pos, neg = (passage_string(c.get("title", "") or "", c["text"], "[SEP]") for c in example.passages[:2])
        out.append((example.question, pos, neg))
    return out


def triplet_examples(rows: list[tuple[str, str, str]]):
    """taser's training examples of (question, positive, hard negative) rows, the positive first."""
    from taser.training.batching import Example

    return [Example(q, [{"title": "", "text": p}, {"title": "", "text": n}]) for q, p, n in rows]


def sentence_transformer():
    from sentence_transformers import SentenceTransformer

    from taser.models.pretrained import SHIPPED_MODEL, resolve_pretrained

    model = SentenceTransformer(resolve_pretrained(SHIPPED_MODEL), device="cpu")
    model.max_seq_length = MAX_LENGTH
    return model


def taser_model(unpad: bool | None):
    from taser.models.loading import load_model

    return load_model({"model_type": "shared", "max_length": MAX_LENGTH, "max_question_length": MAX_LENGTH, "unpad": unpad})


# -- equal maths ------------------------------------------------------------------------------


def loss_check(data: dict) -> dict:
    import torch
    from sentence_transformers.losses import MultipleNegativesRankingLoss

    from taser.training.batching import collate
    from taser.training.config import TrainConfig
    from taser.training.loss import retrieval_loss

    batch = triplets(data["train_files"][0], BATCH, BASE_TRAIN["seed"])
    st = sentence_transformer().eval()
    features = [getattr(st, "preprocess", st.tokenize)([t[c] for t in batch]) for c in range(3)]
    with torch.no_grad():
        st_loss = float(MultipleNegativesRankingLoss(st, scale=SCALE)(features, None))
    ours = {}
    for unpad in (False, True):
        model, tokenizer = taser_model(unpad)
        model.eval()
        examples = triplet_examples(batch)
        b = collate(examples, tokenizer, MAX_LENGTH, MAX_LENGTH)
        with torch.no_grad():
            out = model(b.questions, b.passages)
            loss_cfg = TrainConfig.from_value({**BASE_TRAIN, "temperature": 1 / SCALE}).loss_config(model.config)
            nll, _ = retrieval_loss(out.questions, out.passages, b.positive_idx, b.ctx_owner, loss_cfg)
        ours[unpad] = float(nll.mean())
    return {"sentence_transformers": st_loss, "taser": ours[False], "taser_unpad": ours[True]}


# -- one measured run (a child process) ---------------------------------------------------------


def evaluate(encode_p, encode_q, data: dict) -> dict:
    """Encoding rates and top-1/5 by exact search over the corpus."""
    import numpy as np

    from taser.data.passages import read_passages
    from taser.data.qa import read_qa
    from taser.evaluation.answers import has_answer

    passages = list(read_passages(data["passages"]))
    qa = list(read_qa(data["qa_file"]))
    start = time.perf_counter()
    p = encode_p(passages)
    p_rate = len(passages) / (time.perf_counter() - start)
    start = time.perf_counter()
    q = encode_q([x.question for x in qa])
    q_rate = len(qa) / (time.perf_counter() - start)
    top = np.argsort(-(q @ p.T), axis=1)[:, :5]
    hits = np.array([[has_answer(x.answers, passages[j].text, "string") for j in row] for x, row in zip(qa, top)])
    return {"passages_per_s": p_rate, "questions_per_s": q_rate, "top1": 100 * hits[:, 0].mean(), "top5": 100 * hits.any(1).mean()}


def run_sentence_transformers(data: dict, steps: int, work: Path) -> dict:
    import torch
    from datasets import Dataset
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments
    from sentence_transformers.losses import MultipleNegativesRankingLoss
    from transformers import TrainerCallback

    from taser.models.inputs import passage_string
    from taser.runtime import resolve_precision

    precision = resolve_precision("auto")
    torch.manual_seed(BASE_TRAIN["seed"])
    rows = triplets(data["train_files"][0], steps * BATCH, BASE_TRAIN["seed"])
    dataset = Dataset.from_dict({"anchor": [r[0] for r in rows], "positive": [r[1] for r in rows], "negative": [r[2] for r in rows]})
    model = sentence_transformer()
    ends: list[float] = []

    class StepClock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            ends.append(time.perf_counter())

    args = SentenceTransformerTrainingArguments(
        output_dir=str(work / "st"), per_device_train_batch_size=BATCH, max_steps=steps, learning_rate=LR, warmup_steps=WARMUP_STEPS,
        max_grad_norm=BASE_TRAIN["grad_clip"], weight_decay=0.0, bf16=precision == "bf16", use_cpu=True, save_strategy="no",
        report_to="none", logging_steps=10**6, seed=BASE_TRAIN["seed"], dataloader_drop_last=True, disable_tqdm=True,
    )
    start = time.perf_counter()
    SentenceTransformerTrainer(model=model, args=args, train_dataset=dataset, loss=MultipleNegativesRankingLoss(model, scale=SCALE),
                               callbacks=[StepClock()]).train()
    train_s = time.perf_counter() - start
    train_peak = hwm_gb()

    def passages(ps):
        return model.encode([passage_string(p.title, p.text, "[SEP]") for p in ps], batch_size=64, convert_to_numpy=True)

    scores = evaluate(passages, lambda qs: model.encode(qs, batch_size=64, convert_to_numpy=True), data)
    return {"library": "sentence-transformers", "step_ends": ends, "train_s": train_s, "train_peak_rss_gb": train_peak, **scores}


def run_taser(data: dict, steps: int, work: Path, unpad: bool | None) -> dict:
    from taser.data.biencoder_json import BiEncoderJsonFile
    from taser.models.encoding import encode_passages, encode_questions
    from taser.training.config import TrainConfig
    from taser.training.trainer import Trainer

    model, tokenizer = taser_model(unpad)
    cfg = TrainConfig.from_value({**BASE_TRAIN, "batch_size": BATCH, "max_steps": steps, "learning_rate": LR, "warmup_steps": WARMUP_STEPS,
                                  "temperature": 1 / SCALE, "log_every": 10**6})
    ends: list[float] = []
    start = time.perf_counter()
    Trainer(model, tokenizer, [BiEncoderJsonFile(data["train_files"][0])], cfg, work / "taser", on_step=lambda *_: ends.append(time.perf_counter())).train()
    train_s = time.perf_counter() - start
    train_peak = hwm_gb()
    scores = evaluate(lambda ps: encode_passages(model, tokenizer, ps, batch_size=64), lambda qs: encode_questions(model, tokenizer, qs, batch_size=64), data)
    name = "taser" + ("" if unpad is None else f" (unpad={unpad})")
    return {"library": name, "step_ends": ends, "train_s": train_s, "train_peak_rss_gb": train_peak, **scores}


def child(kind: str, steps: int, warmup: int, work: Path) -> dict:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    data = prepare_squad_with_bm25(work)
    if kind == "loss-check":
        return loss_check(data)
    if kind == "sentence-transformers":
        result = run_sentence_transformers(data, steps, work)
    else:
        unpad = {"taser": None, "taser-padded": False, "taser-unpad": True}[kind]
        result = run_taser(data, steps, work, unpad)
    ends = result.pop("step_ends")
    gaps = [b - a for a, b in zip(ends, ends[1:])]  # step k's time: from step k-1's end to step k's end
    result["s_per_step"] = statistics.median(gaps[warmup - 1:]) if len(gaps) >= warmup else float("nan")
    result["steps_timed"] = len(gaps[warmup - 1:])
    return result


def in_child(kind: str, args) -> dict:
    import subprocess

    cmd = [sys.executable, __file__, "--child", kind, "--steps", str(args.steps), "--warmup", str(args.warmup), "--work", str(args.work)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"})
    if proc.returncode:
        raise SystemExit(f"{kind} failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# -- the report -----------------------------------------------------------------------------------


def report(check: dict, runs: list[dict], args) -> str:
    peer = [r for r in runs if r["library"] == "sentence-transformers"]
    lines = [
        "| pair | library | s/step (median) | steps/s | training peak RSS GB | passages/s | questions/s | top-1 | top-5 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        lines.append(f"| {r['pair']} | {r['library']} | {r['s_per_step']:.2f} | {1 / r['s_per_step']:.3f} | {r['train_peak_rss_gb']:.2f} | "
                     f"{r['passages_per_s']:.1f} | {r['questions_per_s']:.0f} | {r['top1']:.1f} | {r['top5']:.1f} |")
    ratios = ["", "| library | step rate vs sentence-transformers | passages/s vs | questions/s vs | peak RSS vs |", "|---|---|---|---|---|"]
    for name in dict.fromkeys(r["library"] for r in runs if r["library"] != "sentence-transformers"):
        per_pair = []
        for pair in sorted({r["pair"] for r in runs}):
            mine = next((r for r in runs if r["pair"] == pair and r["library"] == name), None)
            theirs = next((r for r in peer if r["pair"] == pair), None)
            if mine and theirs:
                per_pair.append((theirs["s_per_step"] / mine["s_per_step"], mine["passages_per_s"] / theirs["passages_per_s"],
                                 mine["questions_per_s"] / theirs["questions_per_s"], mine["train_peak_rss_gb"] / theirs["train_peak_rss_gb"]))
        if per_pair:
            cells = [f"{statistics.median(x[i] for x in per_pair):.2f}x ({', '.join(f'{x[i]:.2f}' for x in per_pair)})" for i in range(4)]
            ratios.append(f"| {name} | " + " | ".join(cells) + " |")
    return (
        "## Side by side\n\n"
        f"Equal maths, first batch, dropout off, same weights: loss {check['sentence_transformers']:.6f} (sentence-transformers) vs "
        f"{check['taser']:.6f} (taser, padded) and {check['taser_unpad']:.6f} (taser, padding-free).\n\n"
        f"{args.steps} training steps per run, timed after {args.warmup} warm-up steps; each pair runs the libraries one after the other.\n\n"
        + "\n".join(lines) + "\n" + "\n".join(ratios) + "\n\nRatios are medians over pairs (each pair's value in brackets); "
        "above 1 is taser ahead, except peak RSS where below 1 is taser lighter.\n"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", type=Path, default=ROOT / "outputs" / "bench-peers")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=14)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--libraries", nargs="+", default=["sentence-transformers", "taser"],
                    help="sentence-transformers, taser (its defaults), taser-padded, taser-unpad")
    ap.add_argument("--out", type=Path, default=HERE / "results.md")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.steps, args.warmup, args.work)))
        return
    args.work.mkdir(parents=True, exist_ok=True)
    prepare_squad_with_bm25(args.work)
    check = in_child("loss-check", args)
    print(json.dumps(check), flush=True)
    runs = []
    for pair in range(1, args.pairs + 1):
        for kind in args.libraries:
            runs.append({"pair": pair, **in_child(kind, args)})
            print(json.dumps(runs[-1]), flush=True)
    (args.work / "results.json").write_text(json.dumps({"loss_check": check, "runs": runs}, indent=2))
    text = (f"# taser vs sentence-transformers\n\nCommand: `{command_line(__file__)}`\n\n{machine_line()}\n\n" + (__doc__.split("\n\n", 2)[2]) + "\n"
            + report(check, runs, args))
    write_keeping_section(args.out, text, LEVERS)
    print(text)


if __name__ == "__main__":
    main()
