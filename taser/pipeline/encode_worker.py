"""One torchrun rank of a table's dense-index stage: encodes its shard of the passages (`python -m
taser.pipeline.encode_worker spec.json`, started by `taser.pipeline.evaluate.dense_index` when the
job has several GPUs; not for users)."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path


def main(spec_file: str) -> None:
    from taser.pipeline.encode import encode_corpus

    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    spec = json.loads(Path(spec_file).read_text(encoding="utf-8"))
    encode_corpus(spec["checkpoint"], spec["passages"], spec["out_dir"], batch_size=spec["batch_size"], precision=spec["precision"],
                  device=spec["device"], backend=spec["backend"], chunk_size=spec["chunk_size"], progress=False)  # shard: this rank of the world


if __name__ == "__main__":
    main(sys.argv[1])
