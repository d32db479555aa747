"""The reader's settings (`configs/train_reader.yaml`, `configs/read.yaml`): typed schemas that
Hydra checks at composition, and `__post_init__` checks before any model or data is loaded.
No torch here: reading a config stays cheap."""

from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import MISSING

from taser.choice import Choice
from taser.data.config import Match
from taser.precision import Precision


class ReaderStage(Choice):
    open_domain = "open_domain"  # DPR's: per question a positive and m - 1 negatives among its retrieved passages (both heads)
    reading = "reading"  # reading comprehension: each question's gold passage alone (the span head; gold_file)


def _check_ints(owner, prefix: str, names: tuple[str, ...], minimum: int) -> None:
    for name in names:
        value = getattr(owner, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise ValueError(f"{prefix}{name} must be an integer >= {minimum}, got {value!r}")


@dataclass
class ReaderModelSettings:
    pretrained: str | None = None  # a BERT-family encoder (local path or hub name); None: the shipped MiniLM
    init_checkpoint: str | None = None  # continue from a reader checkpoint directory instead (an imported DPR reader too)
    max_length: int = 256  # tokens of [CLS] question [SEP] title [SEP] passage (DPR: 350)
    max_question_length: int = 64  # question tokens kept (the passage gets the rest)
    dropout: float | None = None  # None: the encoder's own (0.1 for BERT and MiniLM)
    max_answer_length: int | None = None  # subword tokens of an answer span when reading, recorded in the checkpoint (None: init_checkpoint's, else DPR's 10)

    def __post_init__(self):
        _check_ints(self, "model.", ("max_length", "max_question_length"), 1)
        if self.max_answer_length is not None:
            _check_ints(self, "model.", ("max_answer_length",), 1)
        if self.max_question_length + 8 > self.max_length:
            raise ValueError(f"model.max_question_length={self.max_question_length} leaves no room for a passage in "
                             f"model.max_length={self.max_length}")
        if self.dropout is not None and not 0 <= self.dropout < 1:
            raise ValueError(f"model.dropout must be in [0, 1) or null, got {self.dropout}")


@dataclass
class ReaderTrainConfig:
    batch_size: int = 16  # questions per rank per step (DPR: 16)
    passages: int = 24  # m: one positive and m - 1 negatives per question (DPR: 24)
    top_n: int = 100  # the positive and negatives come from the retriever's first top_n passages (DPR: 100)
    max_answers: int = 10  # answer spans of the positive passage marginalised over (DPR: 10)
    stage: ReaderStage = ReaderStage.open_domain  # reading: gold passages only (needs gold_file); see ReaderStage
    learning_rate: float = 1e-5  # DPR: 1e-5 (the encoder's rate; the heads' too unless head_learning_rate is set)
    head_learning_rate: float | None = None  # the freshly drawn span and selection heads' rate (None: learning_rate)
    weight_decay: float = 0.0
    adam_eps: float = 1e-8
    warmup_steps: int = 0
    max_steps: int | None = None  # None: epochs x steps per epoch
    epochs: int = 1
    grad_clip: float = 2.0
    max_nonfinite_losses: int = 3  # fp16: this many non-finite losses in a row stop the run (the scaler cannot cure them)
    precision: Precision = Precision.auto  # auto: decided by taser.runtime from the hardware
    seed: int = 12345
    name: str | None = None  # the reader's name in reports (its runs over seeds share it)
    log_every: int = 10
    save_every: int = 500  # 0: only at the end
    eval_every: int = 0  # with dev_file: dev EM every N steps and at the end (0: only at the end); the best weights go to best/
    val_passages: int = 50  # dev questions are answered from their first N passages (DPR: 50)
    val_max_questions: int | None = None  # only the first N dev questions (None: all)
    resume: bool = False
    progress: bool = True
    device: str = "auto"

    def __post_init__(self):
        self.precision = Precision.parse(self.precision, "train.precision")
        self.stage = ReaderStage.parse(self.stage, "train.stage")
        _check_ints(self, "train.", ("batch_size", "passages", "top_n", "max_answers", "epochs", "log_every", "max_nonfinite_losses"), 1)
        _check_ints(self, "train.", ("warmup_steps", "save_every", "eval_every"), 0)
        _check_ints(self, "train.", ("val_passages",), 1)
        if self.val_max_questions is not None:
            _check_ints(self, "train.", ("val_max_questions",), 1)
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"train.max_steps must be >= 1 or null (epochs x steps per epoch), got {self.max_steps}")
        if not self.learning_rate > 0:
            raise ValueError(f"train.learning_rate must be > 0, got {self.learning_rate}")
        if self.head_learning_rate is not None and not self.head_learning_rate > 0:
            raise ValueError(f"train.head_learning_rate must be > 0 or null (learning_rate), got {self.head_learning_rate}")


@dataclass
class TrainReaderJob:
    model: ReaderModelSettings = field(default_factory=ReaderModelSettings)  # the reader's encoder and its heads
    train: ReaderTrainConfig = field(default_factory=ReaderTrainConfig)  # the reader's training run
    train_file: str | None = None  # a retrieval JSON of the training questions (scripts/evaluate.py's retrieval.json)
    gold_file: str | None = None  # the questions' gold passages: a bi-encoder JSON (first positive) or DPR's gold-passage file
    dev_file: str | None = None  # a retrieval JSON of dev questions: the checkpoint with the best dev EM is kept in best/ (DPR's choice)
    match: Match = Match.string  # how has_answer is decided when a ctx lacks it
    output_dir: str = MISSING  # the reader's checkpoints (final/, best/) and logs

    def __post_init__(self):
        stage = ReaderStage.parse(self.train.stage, "train.stage")
        if stage == ReaderStage.reading and not self.gold_file:
            raise ValueError("train.stage=reading trains on gold passages: give gold_file=<bi-encoder JSON or DPR's gold-passage file>")
        if stage == ReaderStage.open_domain and not self.train_file:
            raise ValueError("train.stage=open_domain reads retrieved passages: give train_file=<retrieval JSON of the training questions>")
        if self.train.eval_every and not self.dev_file:
            raise ValueError(f"train.eval_every={self.train.eval_every} needs dev_file=<retrieval JSON of dev questions> to evaluate on")


@dataclass
class ReadJob:
    checkpoint: str = MISSING  # a reader checkpoint directory (train_reader's final/, or an imported DPR reader)
    retrieval: str = MISSING  # a retrieval JSON (scripts/evaluate.py's retrieval.json)
    out_dir: str = MISSING  # predictions.json and results.json
    ks: list[int] = field(default_factory=lambda: [1, 5, 20, 50, 100])  # passages read: EM/F1 at each
    match: Match = Match.string  # regex: answers are CuratedTREC patterns
    max_answer_length: int | None = None  # subword tokens of an answer (None: the checkpoint's model.max_answer_length)
    max_questions: int | None = None  # only the first N questions (None: all)
    batch_size: int = 32  # passages per forward pass
    precision: Precision = Precision.auto  # auto, fp32, bf16, fp16
    device: str = "auto"  # auto, cpu, cuda, ...
    progress: bool = True  # a progress bar (a line every 30 s in a log)
    name: str | None = None  # the system's name in results.json (None: "<reader's train.name or 'reader'> on <retriever>")
    dataset: str | None = None  # None: the dataset of the retrieval's results.json, else the retrieval file's name

    def __post_init__(self):
        self.precision = Precision.parse(self.precision, "precision")
        self.match = Match.parse(self.match, "match")
        if not self.ks or any(not isinstance(k, int) or k < 1 for k in self.ks):
            raise ValueError(f"ks must be a non-empty list of integers >= 1, got {list(self.ks)}")
        self.ks = sorted(set(self.ks))
        _check_ints(self, "", ("batch_size",), 1)
        if self.max_answer_length is not None:
            _check_ints(self, "", ("max_answer_length",), 1)
        if self.max_questions is not None and self.max_questions < 1:
            raise ValueError(f"max_questions must be >= 1 or null (all), got {self.max_questions}")


def register_schemas() -> None:
    """Store the schemas in Hydra's ConfigStore as `train_reader_job` and `read_job` (the YAML files list them first)."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    store.store(name="train_reader_job", node=TrainReaderJob)
    store.store(name="read_job", node=ReadJob)
