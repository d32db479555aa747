"""Writes `taser/models/calibration_texts.json` (package data, read by `taser.models.calibration_texts`): the texts `backend=onnx_int8_static` calibrates its
activation ranges on (taser.models.onnx_backend), drawn from the shipped SQuAD file's training
articles only (the SQuAD protocol's first 30 of 40: `convert_squad`'s default split), so that no
evaluation question or its article is among them.

    python benchmarks/peers/calibration_texts.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from common import ROOT  # noqa: E402

SQUAD = ROOT / "data" / "squad" / "squad-v1.1-dev-40-articles.json"
TRAIN_ARTICLES, COUNT = 30, 128


def spread(items: list, count: int) -> list:
    """`count` items evenly spaced over `items`, in order."""
    return [items[i * len(items) // count] for i in range(count)]


def main() -> None:
    from taser.data.squad import load_squad

    corpus, articles = load_squad(SQUAD)
    train = articles[:TRAIN_ARTICLES]
    questions = spread([q.question for a in train for q in a.questions], COUNT)
    passages = spread([(corpus[i].title, corpus[i].text) for a in train for i in a.passage_ids], COUNT)
    out = ROOT / "taser" / "models" / "calibration_texts.json"
    out.write_text(json.dumps({"questions": questions, "passages": [list(p) for p in passages]}, ensure_ascii=False, indent=0) + "\n")
    print(f"{out}: {len(questions)} questions, {len(passages)} passages")


if __name__ == "__main__":
    main()
