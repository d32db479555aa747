"""Micro-benchmark of padding-free encoding (`model.unpad`, taser.models.unpad): one training
step (forward + backward of an in-batch contrastive loss) and passage encoding, padded against
padding-free, on a MiniLM-sized random BERT (hidden 384, 6 layers, 12 heads, FFN 1536, dropout
0.1) with the SQuAD benchmark's real token lengths (MiniLM's tokenizer, 100-word passages with
titles, max 256).

Each pair runs both paths on the same batch, alternating which goes first; the medians and
their ratio are printed as a Markdown table. Usage:

    python benchmarks/peers/unpad_micro.py [--pairs 8] [--questions 16] [--model-types shared taser] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from common import SQUAD, command_line, machine_line  # noqa: E402
from transformers import AutoModel, BertConfig  # noqa: E402

from taser.data.squad import load_squad  # noqa: E402
from taser.models import unpad as unpad_module  # noqa: E402
from taser.models.biencoder import BiEncoder, load_tokenizer  # noqa: E402
from taser.models.config import BiEncoderConfig  # noqa: E402
from taser.models.inputs import passage_string  # noqa: E402

MAX_LENGTH = 256


def squad_token_ids(tokenizer) -> tuple[list[list[int]], list[list[int]]]:
    corpus, articles = load_squad(SQUAD)
    passages = [passage_string(p.title, p.text, tokenizer.sep_token) for p in corpus]
    questions = [q.question for a in articles for q in a.questions]
    enc = lambda texts: tokenizer(texts, truncation=True, max_length=MAX_LENGTH)["input_ids"]  # noqa: E731
    return enc(questions), enc(passages)


def padded(ids: list[list[int]], pad: int) -> dict[str, torch.Tensor]:
    longest = max(map(len, ids))
    input_ids = torch.full((len(ids), longest), pad, dtype=torch.long)
    mask = torch.zeros((len(ids), longest), dtype=torch.long)
    for i, x in enumerate(ids):
        input_ids[i, : len(x)] = torch.tensor(x)
        mask[i, : len(x)] = 1
    return {"input_ids": input_ids, "attention_mask": mask}


def minilm_sized(model_type: str, vocab_size: int) -> BiEncoder:
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=vocab_size, hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536, max_position_embeddings=512)
    encoders = [AutoModel.from_config(cfg, attn_implementation="taser_sdpa") for _ in range(2 if model_type == "dpr" else 1)]
    return BiEncoder(BiEncoderConfig(model_type=model_type, pooling="mean", normalize=True, max_length=MAX_LENGTH), *encoders)


def train_step(model: BiEncoder, q: dict, p: dict) -> float:
    start = time.perf_counter()
    model.zero_grad(set_to_none=True)
    out = model(q, p)
    scores = out.questions @ out.passages.T / 0.05
    loss = F.cross_entropy(scores, torch.arange(len(scores)))  # positive j of question j; the rest are negatives
    loss.backward()
    return time.perf_counter() - start


@torch.no_grad()
def encode_rate(model: BiEncoder, ids: list[list[int]], pad: int, batch_size: int, by_length: bool) -> float:
    order = sorted(range(len(ids)), key=lambda i: -len(ids[i])) if by_length else list(range(len(ids)))
    start = time.perf_counter()
    for b in range(0, len(order), batch_size):
        enc = padded([ids[i] for i in order[b : b + batch_size]], pad)
        model.encode(enc["input_ids"], enc["attention_mask"], "passage")
    return len(ids) / (time.perf_counter() - start)


def median_pair(measure, pairs: int) -> tuple[float, float]:
    """Medians of `measure(i, unpad)` for unpad False / True over pairs i, alternating which runs first."""
    runs = {False: [], True: []}
    for i in range(pairs):
        for unpad in (True, False) if i % 2 else (False, True):
            runs[unpad].append(measure(i, unpad))
    return statistics.median(runs[False]), statistics.median(runs[True])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=8)
    ap.add_argument("--questions", type=int, default=16, help="questions per step; each brings a positive and a hard negative passage")
    ap.add_argument("--model-types", nargs="+", default=["shared", "taser"])
    ap.add_argument("--encode-passages", type=int, default=256)
    ap.add_argument("--group-ratio", type=float, default=None, help="CPU attention length groups (unpad.GROUP_LENGTH_RATIO); 0: one, 1: one per length")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default); 1 is steadier on a shared, busy machine")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.group_ratio is not None:
        unpad_module.GROUP_LENGTH_RATIO["cpu"] = args.group_ratio

    tokenizer = load_tokenizer("shipped:all-MiniLM-L6-v2")
    pad = tokenizer.pad_token_id
    questions, passages = squad_token_ids(tokenizer)
    rng = random.Random(0)
    steps = [(padded(rng.sample(questions, args.questions), pad), padded(rng.sample(passages, 2 * args.questions), pad)) for _ in range(args.pairs + 1)]
    real = sum(int(b["attention_mask"].sum()) for s in steps for b in s)
    total = sum(b["attention_mask"].numel() for s in steps for b in s)
    q_len = statistics.mean(map(len, questions))
    p_len = statistics.mean(map(len, passages))

    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"Command: `{command_line(__file__)}`\n\n{machine_line('fp32')} torch threads: {torch.get_num_threads()}; load average at start {load}.")
    print(f"Attention length groups: ratio {unpad_module.group_ratio_for(torch.device('cpu'))} (taser.models.unpad.GROUP_LENGTH_RATIO).\n")
    print(f"Data: SQuAD benchmark lengths (MiniLM tokenizer): questions {q_len:.1f} tokens on average, passages {p_len:.1f} (max {MAX_LENGTH}).")
    print(
        f"Training batches: {args.questions} questions + {2 * args.questions} passages, "
        f"padded to each batch's longest: {1 - real / total:.0%} of the tokens are padding.\n"
    )
    print("| model | measure | padded | padding-free | speed-up |")
    print("|---|---|---|---|---|")
    for model_type in args.model_types:
        for row in measure(minilm_sized(model_type, tokenizer.vocab_size), steps, rng.sample(passages, args.encode_passages), pad, args.pairs):
            print(f"| {model_type} | " + row, flush=True)


def measure(model: BiEncoder, steps: list, sample: list[list[int]], pad: int, pairs: int):
    """Table rows (after the model column): training step time, then encoding rates."""
    model.train()
    for unpad in (True, False):  # warm-up
        model.unpad = unpad
        train_step(model, *steps[-1])

    def step(i: int, unpad: bool) -> float:
        model.unpad = unpad
        return train_step(model, *steps[i])

    slow, fast = median_pair(step, pairs)
    yield f"training step, s (median of {pairs}) | {slow:.3f} | {fast:.3f} | {slow / fast:.2f}x |"
    model.eval()
    encode_pairs = max(3, pairs // 2)
    for by_length in (False, True):

        def rate(i: int, unpad: bool, by_length: bool = by_length) -> float:
            model.unpad = unpad
            return encode_rate(model, sample, pad, 64, by_length)

        a, b = median_pair(rate, encode_pairs)
        what = "sorted by length (as encode_texts)" if by_length else "in random order"
        yield f"encoding passages/s, batches of 64 {what} (median of {encode_pairs}) | {a:.1f} | {b:.1f} | {b / a:.2f}x |"


if __name__ == "__main__":
    main()
