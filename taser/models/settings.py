"""What a run asks of its model (`model.*` in the Hydra configs): where the weights come from and
what to override. One schema for every model type; `taser.models.loading` turns it into a model.

None means "the model's own": the pretrained checkpoint's pooling and normalisation (MiniLM:
mean, normalised; BERT: [CLS], not normalised), or a taser checkpoint's saved settings.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from taser.choice import settings_from
from taser.models.config import MODEL_KINDS, Attention, ModelType, Pooling, Similarity
from taser.models.pretrained import SHIPPED_MODEL
from taser.models.taser_config import TaserConfig

DEFAULT_MAX_LENGTH = 256


def _none_if_auto(value):
    return None if value == "auto" else value


@dataclass
class ModelSettings:
    model_type: ModelType = ModelType.dpr
    pretrained: str | None = None  # a local path or hub name of a BERT-family encoder; None: SHIPPED_MODEL
    init_checkpoint: str | None = None  # continue from a taser checkpoint directory instead
    pooling: Pooling | None = None  # None: the model's own
    normalize: bool | None = None  # None: the model's own
    similarity: Similarity | None = None  # None: the checkpoint's, else dot
    max_length: int | None = None  # None: the checkpoint's, else 256
    max_question_length: int | None = None  # None: the checkpoint's, else 256
    dropout: float | None = None  # None: the checkpoint's (0.1 for BERT and MiniLM)
    attention_dropout: float | None = None  # None: as `dropout`
    attention: Attention = Attention.taser_sdpa
    # padding-free encoding (taser.models.unpad): None, on CPUs where the attention allows it (taser_sdpa); true requires it
    unpad: bool | None = None
    taser: TaserConfig = field(default_factory=TaserConfig)  # model_type=taser only

    def __post_init__(self):
        self.model_type = ModelType.parse(self.model_type, "model.model_type")
        self.pooling = _none_if_auto(self.pooling)
        self.normalize = _none_if_auto(self.normalize)
        if self.pooling is not None:
            self.pooling = Pooling.parse(self.pooling, "model.pooling")
        if self.similarity is not None:
            self.similarity = Similarity.parse(self.similarity, "model.similarity")
        if self.similarity == Similarity.cosine and self.init_checkpoint is None:  # a checkpoint's own are its own (check_settings)
            if self.normalize is False:
                raise ValueError("model.similarity=cosine scores unit vectors, and model.normalize=false would index the raw ones (an inner-product "
                                 "search would then rank by dot product, not by the cosine trained): set model.normalize to true or null")
            self.normalize = True
        self.attention = Attention.parse(self.attention, "model.attention")
        self.unpad = _none_if_auto(self.unpad)
        if self.unpad not in (None, True, False):
            raise ValueError(f"model.unpad must be true, false or null (where the attention allows it), got {self.unpad!r}")
        if self.unpad and self.attention != Attention.taser_sdpa:
            raise ValueError(f"model.unpad=true needs model.attention={Attention.taser_sdpa} (got {self.attention}); set model.unpad to false or null")
        if isinstance(self.taser, dict) or self.taser is None:
            self.taser = TaserConfig.from_dict(self.taser or {})
        for name in ("max_length", "max_question_length"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 2):
                raise ValueError(f"model.{name} must be an integer >= 2 (or null for the model's own), got {value!r}")
        for name in ("dropout", "attention_dropout"):
            value = getattr(self, name)
            if value is not None and not 0 <= value < 1:
                raise ValueError(f"model.{name} must be in [0, 1) (or null for the model's own), got {value!r}")
        if self.pretrained is not None and self.init_checkpoint is not None:
            raise ValueError(
                f"model.pretrained={self.pretrained} and model.init_checkpoint={self.init_checkpoint} are both set: "
                "a checkpoint brings its own weights; set one of them"
            )
        if not MODEL_KINDS[self.model_type].specialised and self.taser != TaserConfig():
            changed = sorted(k for k, v in asdict(self.taser).items() if v != getattr(TaserConfig(), k))
            raise ValueError(f"model.taser.{changed[0]} applies only to model_type=taser (this model is {self.model_type})")

    @classmethod
    def from_value(cls, value: ModelSettings | dict) -> ModelSettings:
        """Settings from a dict (unknown keys are an error) or from settings (returned as they are)."""
        return settings_from(cls, value, "model")

    @property
    def source(self) -> str:
        """Where the weights come from: the checkpoint, else the pretrained model."""
        return self.init_checkpoint or self.pretrained or SHIPPED_MODEL
