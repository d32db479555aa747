"""The precision setting, a closed choice. It is kept apart from `taser.runtime`, which resolves
`auto` from the hardware, so that reading a config does not import torch (about 190 MB of
resident memory in `build_index`, which never needs it)."""

from __future__ import annotations

from taser.choice import Choice


class Precision(Choice):
    auto = "auto"
    fp32 = "fp32"
    bf16 = "bf16"
    fp16 = "fp16"
