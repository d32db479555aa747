"""A synthetic bi-encoder training file shaped like DPR's NQ training JSON: each record has a
question, answers, and `positive_ctxs`, `negative_ctxs`, `hard_negative_ctxs` whose ctxs carry
`title`, `text` (~100 words, as DPR's passages), `score`, `title_score` and `passage_id`.

Texts are drawn from a pool of pseudo-word passages (generating 5M distinct 100-word texts in
Python would take longer than the measurement); only the size and shape of records matter to a
reader's memory and speed.

`python benchmarks/hub_data/synthetic.py out.json --records 1000000`
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from taser.data.biencoder_json import write_biencoder_json  # noqa: E402

WORDS_PER_PASSAGE = 100


def _vocabulary(rng: random.Random, size: int = 20_000) -> list[str]:
    letters = "etaoinshrdlucmfwypvbgkjqxz"
    weights = [12, 9, 8, 7, 7, 6, 6, 6, 6, 4, 4, 3, 3, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1]
    return ["".join(rng.choices(letters, weights, k=rng.choice((2, 3, 3, 4, 5, 5, 6, 7, 8, 10)))) for _ in range(size)]


def records(n: int, positives: int = 1, negatives: int = 2, hard_negatives: int = 2, seed: int = 0, pool: int = 20_000):
    rng = random.Random(seed)
    vocab = _vocabulary(rng)
    texts = [" ".join(rng.choices(vocab, k=WORDS_PER_PASSAGE)) for _ in range(pool)]
    titles = [" ".join(rng.choices(vocab, k=rng.randint(1, 4))).title() for _ in range(pool)]
    corpus_size = 21_015_324  # psgs_w100.tsv's passage count: passage ids in its range

    def ctx(score: float) -> dict:
        j = rng.randrange(pool)
        return {"title": titles[j], "text": texts[j], "score": round(score, 4), "title_score": 0, "passage_id": str(rng.randrange(1, corpus_size))}

    for _ in range(n):
        question = " ".join(rng.choices(vocab, k=rng.randint(6, 14)))
        yield {
            "dataset": "synthetic_nq_shape",
            "question": f"{question}?",
            "answers": [" ".join(rng.choices(vocab, k=rng.randint(1, 3))) for _ in range(rng.randint(1, 2))],
            "positive_ctxs": [ctx(1000.0) for _ in range(positives)],
            "negative_ctxs": [ctx(rng.uniform(5, 15)) for _ in range(negatives)],
            "hard_negative_ctxs": [ctx(rng.uniform(10, 25)) for _ in range(hard_negatives)],
        }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("--records", type=int, default=1_000_000)
    p.add_argument("--positives", type=int, default=1)
    p.add_argument("--negatives", type=int, default=2)
    p.add_argument("--hard-negatives", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    n = write_biencoder_json(a.out, records(a.records, a.positives, a.negatives, a.hard_negatives, a.seed))
    print(f"{a.out}: {n} records, {Path(a.out).stat().st_size / 1e9:.2f} GB")


if __name__ == "__main__":
    main()
