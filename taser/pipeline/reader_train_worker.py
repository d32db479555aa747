"""One torchrun rank of a table's reader stage (`python -m taser.pipeline.reader_train_worker spec.json`,
started by `taser.pipeline.reader_stages` when a job has several GPUs; not for users)."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path


def main(spec_file: str) -> None:
    from taser.pipeline.reader_stages import train_reader_here

    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    spec = json.loads(Path(spec_file).read_text(encoding="utf-8"))
    train_reader_here(spec["model"], spec["init"], spec["train"], spec["gold"], spec["retrieval"], spec["match"], Path(spec["out"]),
                      spec["progress"])


if __name__ == "__main__":
    main(sys.argv[1])
