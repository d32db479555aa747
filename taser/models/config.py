"""What a bi-encoder checkpoint is: saved as the `taser` block of its `config.json`."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

MODEL_TYPES = ("dpr", "shared", "taser")
SIMILARITIES = ("dot", "cosine", "l2")


@dataclass
class BiEncoderConfig:
    model_type: str = "dpr"
    pretrained: str = ""  # where the weights came from at initialisation (informational)
    pooling: str = "cls"
    normalize: bool = False
    similarity: str = "dot"
    max_length: int = 256
    max_question_length: int = 256
    # TASER only: the specialisation layout and routing (see taser.models.taser_encoder)
    taser: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if self.model_type not in MODEL_TYPES:
            raise ValueError(f"unknown model_type {self.model_type!r}; expected one of {MODEL_TYPES}")
        if self.similarity not in SIMILARITIES:
            raise ValueError(f"unknown similarity {self.similarity!r}; expected one of {SIMILARITIES}")
        if self.pooling not in ("cls", "mean"):
            raise ValueError(f"unknown pooling {self.pooling!r}; expected 'cls' or 'mean'")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "BiEncoderConfig":
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown bi-encoder config keys: {sorted(unknown)}")
        return cls(**d)
