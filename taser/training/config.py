"""The `train` block of the training config."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from taser.choice import settings_from
from taser.precision import Precision
from taser.training.loss_kind import LossKind

if TYPE_CHECKING:
    from taser.models.config import BiEncoderConfig
    from taser.training.loss import LossConfig


@dataclass
class TrainConfig:
    batch_size: int = 16  # questions per rank per micro-batch
    hard_negatives: int = 1
    other_negatives: int = 0
    in_batch: bool = True  # False: DPR's "1-of-N" without in-batch negatives
    # other training questions' positives as each question's own negatives (DPR Table 3's "Gold" 1-of-N); never its own positive
    gold_negatives: int = 0
    loss: str = "nll"  # nll (DPR's softmax NLL) or triplet (DPR Table 6: hinge with `margin`; taser.training.loss)
    margin: float = 1.0  # the triplet loss's margin (DPR's 1.0); unused by nll
    # a fixed subset of the training questions (DPR Figure 1): this many, the same at every epoch and resume; null: all
    train_questions: int | None = None
    train_subset: str = "first"  # first: the first N records; seeded: N drawn once from `seed`
    temperature: float | None = None  # None: 0.05 for normalised vectors or cosine, else 1 (DPR)
    learning_rate: float = 2e-5
    weight_decay: float = 0.0
    adam_eps: float = 1e-8
    layer_decay: float | None = None  # layer-wise lr decay (TASER: 0.8)
    warmup_steps: int = 100
    max_steps: int | None = None  # default: epochs x batches per epoch
    epochs: int = 1
    grad_clip: float = 2.0
    max_nonfinite_losses: int = 3  # fp16: this many non-finite losses in a row stop the run (the scaler cannot cure them)
    grad_accumulation: int = 1
    grad_cache_chunk: int = 0  # >0: gradient caching with chunks of this many sequences
    precision: Precision = Precision.auto  # auto: decided by taser.runtime from the hardware
    seed: int = 12345  # a sweep `-m train.seed=1,2,3` gives one run per seed (output_dir/multirun/...train.seed=N); evaluations record it
    name: str | None = None  # the system's name in evaluations' results.json and reports, the same for every seed (None: from the model)
    log_every: int = 10
    eval_every: int = 0  # 0: only at the end
    save_every: int = 500  # 0: only at the end
    val_max_questions: int = 500
    val_batch_size: int = 64
    resume: bool = False
    sampling_rates: list[float] | None = None
    progress: bool = True
    tensorboard: bool = False  # also write TensorBoard event files (output_dir/tensorboard/): loss, lr, accuracy, routing, validation
    device: str = "auto"
    loader_workers: int | None = None  # processes building batches; null: some on a GPU, none on a CPU (taser.training.loader)
    # compiled training steps (torch.compile, inductor) for long runs: the first run compiles (minutes), later ones read the
    # compiler's caches; inputs are padded to `compile_buckets` lengths per side (docs/training.md, taser.training.compiled)
    compile: bool = False
    compile_buckets: int = 4
    compile_cache_dir: str | None = None  # null: $TORCHINDUCTOR_CACHE_DIR if set, else $XDG_CACHE_HOME/taser/torch-compile (~/.cache/...)

    def __post_init__(self):
        if self.temperature == "auto":
            self.temperature = None
        self.precision = Precision.parse(self.precision, "train.precision")
        positive = ("batch_size", "grad_accumulation", "epochs", "val_batch_size", "log_every", "max_nonfinite_losses", "compile_buckets")
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"train.{name} must be an integer >= 1, got {value!r}")
        self.loss = LossKind.parse(self.loss, "train.loss").value
        if not isinstance(self.margin, (int, float)) or isinstance(self.margin, bool) or not self.margin > 0:
            raise ValueError(f"train.margin (the triplet loss's) must be > 0, got {self.margin!r}")
        if self.loss == "triplet" and self.temperature is not None:
            raise ValueError(f"train.temperature={self.temperature} scales the NLL's scores; the triplet loss compares raw scores with "
                             "train.margin: leave train.temperature null")
        if self.train_subset not in ("first", "seeded"):
            raise ValueError(f"unknown train.train_subset {self.train_subset!r}; expected one of first, seeded")
        if self.train_questions is not None and (not isinstance(self.train_questions, int) or isinstance(self.train_questions, bool)
                                                 or self.train_questions < 1):
            raise ValueError(f"train.train_questions must be an integer >= 1 or null (every training question), "
                             f"got {self.train_questions!r}")
        for name in ("hard_negatives", "other_negatives", "gold_negatives", "warmup_steps", "grad_cache_chunk", "eval_every", "save_every",
                     "val_max_questions"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"train.{name} must be an integer >= 0, got {value!r}")
        if self.loader_workers is not None and (not isinstance(self.loader_workers, int) or isinstance(self.loader_workers, bool) or self.loader_workers < 0):
            raise ValueError(f"train.loader_workers must be an integer >= 0 or null (chosen from the device), got {self.loader_workers!r}")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"train.max_steps must be >= 1 or null (epochs x batches), got {self.max_steps}")
        if self.temperature is not None and not self.temperature > 0:
            raise ValueError(f"train.temperature must be > 0 or null (auto), got {self.temperature}")
        if not self.learning_rate > 0:
            raise ValueError(f"train.learning_rate must be > 0, got {self.learning_rate}")
        if not isinstance(self.compile, bool):
            raise ValueError(f"train.compile must be true or false, got {self.compile!r}")
        if self.compile:
            from taser.training.compile_plan import settings_refusal  # torch-free

            refusal = settings_refusal(self.grad_cache_chunk)
            if refusal:
                raise ValueError(refusal)

    def resolved_temperature(self, normalize: bool, similarity: str) -> float:
        """Unit-length vectors score in [-1, 1]; without a temperature the softmax is nearly flat."""
        if self.temperature is not None:
            return float(self.temperature)
        return 0.05 if normalize or similarity == "cosine" else 1.0

    def loss_config(self, model_config: BiEncoderConfig) -> LossConfig:
        """The contrastive loss of a model with `model_config` (its similarity, normalisation)."""
        from taser.training.loss import LossConfig  # imported here: keeps this module free of torch

        temperature = self.resolved_temperature(model_config.normalize, model_config.similarity)
        return LossConfig(model_config.similarity, temperature, self.in_batch, self.loss, self.margin)

    @classmethod
    def from_value(cls, value: TrainConfig | dict) -> TrainConfig:
        """Settings from a dict (unknown keys are an error) or from settings (returned as they are)."""
        return settings_from(cls, value, "train")
