"""What a bi-encoder checkpoint is: saved as the `taser` block of its `config.json`."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from taser.choice import Choice


class ModelType(Choice):
    dpr = "dpr"  # two encoders (question, passage)
    shared = "shared"  # one encoder for both
    taser = "taser"  # one encoder with input-type-specialised blocks


@dataclass(frozen=True)
class ModelKind:
    """What a model type is made of; code asks these questions instead of comparing names."""

    two_encoders: bool  # a question encoder and a separately parameterised passage encoder
    specialised: bool  # one encoder with TASER's input-type experts


MODEL_KINDS = {
    ModelType.dpr: ModelKind(two_encoders=True, specialised=False),
    ModelType.shared: ModelKind(two_encoders=False, specialised=False),
    ModelType.taser: ModelKind(two_encoders=False, specialised=True),
}


class Similarity(Choice):
    dot = "dot"
    cosine = "cosine"
    l2 = "l2"  # negative squared Euclidean distance


TASER_SDPA = "taser_sdpa"


class Attention(Choice):
    taser_sdpa = TASER_SDPA  # SDPA, with the chunked kernel for CPU training with attention dropout
    sdpa = "sdpa"  # transformers' own
    eager = "eager"


class Pooling(Choice):
    cls = "cls"
    mean = "mean"


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
        self.model_type = ModelType.parse(self.model_type, "model_type").value
        self.similarity = Similarity.parse(self.similarity, "similarity").value
        self.pooling = Pooling.parse(self.pooling, "pooling").value
        if self.similarity == Similarity.cosine:
            # cosine is the dot product of unit vectors: encoding writes them, so an inner-product index searches what was trained
            self.normalize = True

    @property
    def kind(self) -> ModelKind:
        return MODEL_KINDS[ModelType(self.model_type)]

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> BiEncoderConfig:
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown bi-encoder config keys: {sorted(unknown)}")
        return cls(**d)
