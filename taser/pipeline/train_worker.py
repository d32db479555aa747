"""One torchrun rank of a table's training stage (`python -m taser.pipeline.train_worker spec.json`,
started by `taser.pipeline.rows` when a job has several GPUs; not for users)."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path


def main(spec_file: str) -> None:
    from taser.pipeline.train import run_training

    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    spec = json.loads(Path(spec_file).read_text(encoding="utf-8"))
    run_training(spec["model"], spec["train_files"], spec["train"], spec["output_dir"])


if __name__ == "__main__":
    main(sys.argv[1])
