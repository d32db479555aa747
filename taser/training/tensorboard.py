"""Training curves as TensorBoard event files (`train.tensorboard=true`), through PyTorch's own
`torch.utils.tensorboard.SummaryWriter`, beside `train_log.jsonl` in the output directory.

Each step's record becomes scalars under tags by kind: `train/loss`, `train/lr`,
`train/in_batch_accuracy`, `train/grad_norm`, `train/questions_per_s`, `routing/<part>` (TASER's
routing losses) and `val/<metric>` (validation). A resumed run purges the events after its
checkpoint's step, so the curves are those of one uninterrupted run.

    tensorboard --logdir outputs/train        # then open http://localhost:6006
"""

from __future__ import annotations

import math
from pathlib import Path

SUBDIR = "tensorboard"

# record key -> tag; keys starting with "aux_" go to routing/, "val_" to val/
TAGS = {
    "loss": "train/loss",
    "lr": "train/lr",
    "acc": "train/in_batch_accuracy",
    "grad_norm": "train/grad_norm",
    "questions_per_s": "train/questions_per_s",
}


def tag_of(key: str) -> str | None:
    """The TensorBoard tag of a training record's key; None for keys that are not curves."""
    if key in TAGS:
        return TAGS[key]
    if key.startswith("aux_"):
        return "routing/" + key.removeprefix("aux_")
    if key.startswith("val_"):
        return "val/" + key.removeprefix("val_")
    return None


class TensorBoardLog:
    """Writes each step's record to `output_dir/tensorboard/` (call from the main rank only)."""

    def __init__(self, output_dir: str | Path, start_step: int = 0):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:  # torch's writer needs the tensorboard package
            raise ImportError(f"train.tensorboard=true needs the tensorboard package (pip install tensorboard): {e}") from None
        self.log_dir = Path(output_dir) / SUBDIR
        # purge_step: events of steps after the resumed checkpoint (from the killed run) are dropped
        self._writer = SummaryWriter(str(self.log_dir), purge_step=start_step + 1 if start_step else None)

    def write(self, record: dict) -> None:
        step = int(record["step"])
        for key, value in record.items():
            tag = tag_of(key)
            if tag is not None and isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                self._writer.add_scalar(tag, float(value), step)

    def close(self) -> None:
        self._writer.flush()
        self._writer.close()
