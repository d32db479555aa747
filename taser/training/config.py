"""The `train` block of the training config."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from taser.models.config import BiEncoderConfig
    from taser.training.loss import LossConfig


@dataclass
class TrainConfig:
    batch_size: int = 16  # questions per rank per micro-batch
    hard_negatives: int = 1
    other_negatives: int = 0
    in_batch: bool = True  # False: DPR's "1-of-N" without in-batch negatives
    temperature: float | str = "auto"  # auto: 0.05 for normalised vectors or cosine, else 1 (DPR)
    learning_rate: float = 2e-5
    weight_decay: float = 0.0
    adam_eps: float = 1e-8
    layer_decay: float | None = None  # layer-wise lr decay (TASER: 0.8)
    warmup_steps: int = 100
    max_steps: int | None = None  # default: epochs x batches per epoch
    epochs: int = 1
    grad_clip: float = 2.0
    grad_accumulation: int = 1
    grad_cache_chunk: int = 0  # >0: gradient caching with chunks of this many sequences
    precision: str = "auto"  # auto | fp32 | bf16 | fp16: auto is decided by taser.runtime from the hardware
    seed: int = 12345
    log_every: int = 10
    eval_every: int = 0  # 0: only at the end
    save_every: int = 0  # 0: only at the end
    val_max_questions: int = 500
    val_batch_size: int = 64
    resume: bool = False
    sampling_rates: list[float] | None = None
    progress: bool = True
    device: str = "auto"
    extra: dict = field(default_factory=dict)

    def resolved_temperature(self, normalize: bool, similarity: str) -> float:
        """Unit-length vectors score in [-1, 1]; without a temperature the softmax is nearly flat."""
        if self.temperature != "auto":
            return float(self.temperature)
        return 0.05 if normalize or similarity == "cosine" else 1.0

    def loss_config(self, model_config: "BiEncoderConfig") -> "LossConfig":
        """The contrastive loss of a model with `model_config` (its similarity, normalisation)."""
        from taser.training.loss import LossConfig  # imported here: keeps this module free of torch

        temperature = self.resolved_temperature(model_config.normalize, model_config.similarity)
        return LossConfig(model_config.similarity, temperature, self.in_batch)

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown train settings: {sorted(unknown)}")
        return cls(**d)
