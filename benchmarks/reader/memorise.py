"""A defect check for the reader on the real model: can MiniLM + DPR's heads learn the answers of a
few training questions from their gold passages, and give them back? Labels one token off, start and
end swapped, or spans mapped to the wrong characters keep exact match near 0 here, however long it trains.

    python benchmarks/reader/memorise.py --questions 32 --steps 160 --lr 1e-4

Prints the EM / F1 (%) of reading the same questions (gold passage only) after training.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import SQUAD, machine_line  # noqa: E402

from taser.cli import setup_logging  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--questions", type=int, default=32)
    ap.add_argument("--steps", type=int, default=160)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--lr", type=float, default=1e-4)
    args = ap.parse_args()
    setup_logging()
    from taser.data.squad import load_squad
    from taser.pipeline.reader import read, train_reader
    from taser.reader.config import ReaderModelSettings, ReaderTrainConfig, ReadJob, TrainReaderJob

    corpus, articles = load_squad(SQUAD)
    questions = [q for a in articles for q in a.questions if q.positive is not None][: args.questions]
    records = [{"question": q.question, "answers": q.answers,
                "ctxs": [{"id": corpus[q.positive].id, "title": corpus[q.positive].title, "text": corpus[q.positive].text, "has_answer": True}]}
               for q in questions]
    with tempfile.TemporaryDirectory() as work:
        data = Path(work) / "gold.json"
        data.write_text(json.dumps(records))
        train = ReaderTrainConfig(batch_size=args.batch, passages=1, learning_rate=args.lr, max_steps=args.steps, warmup_steps=10, save_every=0,
                                  log_every=20, progress=False)
        train_reader(TrainReaderJob(ReaderModelSettings(), train, str(data), output_dir=str(Path(work) / "reader")))
        results = read(ReadJob(str(Path(work) / "reader" / "final"), str(data), str(Path(work) / "read"), ks=[1], progress=False))
    print(machine_line())
    print(f"{len(records)} questions, {args.steps} steps of {args.batch}, lr {args.lr:g}: EM {results['em']['1']:.2f}, F1 {results['f1']['1']:.2f}")


if __name__ == "__main__":
    main()
