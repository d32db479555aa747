"""The GPU check's settings (`configs/gpu_check.yaml`): which models and sizes, how many steps and
passages, the loss check's tolerances. No torch here: reading the config stays cheap."""

from __future__ import annotations

from dataclasses import dataclass, field

from taser.choice import Choice
from taser.models.config import ModelType
from taser.precision import Precision


class Size(Choice):
    tiny = "tiny"  # a 2-layer, hidden-64 random BERT: the CPU dry run (and the tests)
    minilm = "minilm"  # the shipped all-MiniLM-L6-v2 (6 layers, hidden 384, 22.7M parameters)
    bert_base = "bert-base"  # a random BERT-base (12 layers, hidden 768, 110M parameters), MiniLM's vocabulary


class Mode(Choice):
    main = "main"  # what a user runs: one device, then every GPU under torchrun when there are several
    ddp = "ddp"  # one rank under torchrun, started by `main` (not for users)


@dataclass
class Tolerance:
    """|device loss - CPU fp32 loss| <= tolerance x max(1, |CPU fp32 loss|), by the numerics used.

    bf16 keeps 8 significant bits: rounding matrix products' inputs and outputs to bf16 (emulated on
    a CPU) moved the first loss of random BERT-base-sized models by 0.2-1.1% (3 seeds, batches of 4 and 8),
    MiniLM's by 0.001%; fp16 keeps 11 bits (8x finer); fp32 on a GPU differs from the CPU only in
    summation order, unless matrix products run in TF32 (torch.set_float32_matmul_precision)."""

    fp32: float = 1e-4
    tf32: float = 2e-2  # fp32 with TF32 matrix products (10-bit mantissa, as fp16)
    bf16: float = 5e-2
    fp16: float = 2e-2

    def __post_init__(self):
        for name in ("fp32", "tf32", "bf16", "fp16"):
            if not getattr(self, name) > 0:
                raise ValueError(f"check.tolerance.{name} must be > 0, got {getattr(self, name)}")

    def of(self, precision: str) -> float:
        return getattr(self, precision)


@dataclass
class LossCheck:
    """One optimizer step on the device against the same step on the CPU in fp32: same weights,
    same first batch, dropout 0."""

    batch_size: int = 4  # questions per GPU (the CPU reference takes all GPUs' questions at once)
    tolerance: Tolerance = field(default_factory=Tolerance)
    perturb_reference: float = 0.0  # tests only: the reference loss is multiplied by (1 + this), forcing a mismatch

    def __post_init__(self):
        if isinstance(self.tolerance, dict):
            self.tolerance = Tolerance(**self.tolerance)
        if not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ValueError(f"check.batch_size must be an integer >= 1, got {self.batch_size!r}")


@dataclass
class GpuCheckJob:
    out_dir: str = "outputs/gpu_check"  # results.md and results.json
    device: str = "auto"  # auto: the GPU if there is one (each torchrun rank its own), else the CPU
    precision: Precision = Precision.auto  # auto: decided from the hardware (taser.runtime)
    models: list[ModelType] = field(default_factory=lambda: [ModelType.dpr, ModelType.taser])  # which models are checked: dpr, shared, taser
    sizes: list[Size] = field(default_factory=lambda: [Size.minilm, Size.bert_base])  # encoder sizes: minilm, bert_base
    # training: batch_size questions per GPU, each with one hard negative, as DPR's NQ set-up
    batch_size: int = 16
    hard_negatives: int = 1  # per question
    max_length: int = 256  # passage tokens (title + text)
    max_question_length: int = 64  # question tokens
    warm_steps: int = 5  # untimed (allocator, kernel selection); at least 1
    timed_steps: int = 20  # steps/s and questions/s: over these steps
    profiled_steps: int = 5  # GPU utilisation: kernel time / wall time over these (after one profiler warm-up step)
    check: LossCheck = field(default_factory=LossCheck)  # the loss check against the CPU: its tolerance and steps
    # encoding: passages of the shipped SQuAD corpus (2,141, repeated as needed) and its questions
    passages: int = 4000  # passages encoded for the encoding speed
    questions: int = 2000  # questions encoded
    encode_batch_size: int = 128  # passages encoded at once
    squad_json: str = "data/squad/squad-v1.1-dev-40-articles.json"  # the data the check trains and encodes
    articles: int | None = None  # only the first N articles of squad_json (None: all 40); the CPU dry run takes fewer
    peers: bool = True  # sentence-transformers' encoding figures too, when it is installed
    # the timed steps under torch.cuda.set_sync_debug_mode("warn"): each implicit host-device sync (a tensor read, a
    # data-dependent shape) warns, and the count is reported per run (GPUs only; the timing then includes the warnings)
    sync_debug: bool = False
    # all GPUs: torchrun with this many processes; null: every visible GPU when more than one (else none); 0: never
    ddp_processes: int | None = None
    ddp_timeout_s: int = 1200  # how long the all-GPU pass may take
    mode: Mode = Mode.main  # main (what a user runs); ddp: one rank, started by main
    seed: int = 12345  # the random seed
    progress: bool = True  # progress lines
    # data, model directories and training runs (each run's checkpoints, 3.5 GB for BERT-base DPR, deleted after it):
    # a new directory under work_dir (null: the system's temporary directory), removed at the end unless keep_work
    work_dir: str | None = None  # scratch files (None: a temporary directory)
    keep_work: bool = False  # keep the scratch files

    def __post_init__(self):
        self.precision = Precision.parse(self.precision, "precision")
        self.mode = Mode.parse(self.mode, "mode")
        self.models = [ModelType.parse(m, "models") for m in self.models]
        self.sizes = [Size.parse(s, "sizes") for s in self.sizes]
        if isinstance(self.check, dict):
            self.check = LossCheck(**self.check)
        if not self.models or not self.sizes:
            raise ValueError("models and sizes must each name at least one entry")
        for name in ("batch_size", "warm_steps", "timed_steps", "passages", "questions", "encode_batch_size", "ddp_timeout_s"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        for name in ("hard_negatives", "profiled_steps"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
        if self.ddp_processes is not None and (self.ddp_processes < 0 or self.ddp_processes == 1):
            raise ValueError(f"ddp_processes must be null (every GPU when more than one), 0 (never) or >= 2, got {self.ddp_processes}")
        if self.articles is not None and not 2 <= self.articles:
            raise ValueError(f"articles must be >= 2 (one to train from, one held out) or null (all), got {self.articles}")


def register_schema() -> None:
    """Store the schema in Hydra's ConfigStore as `gpu_check_job` (configs/gpu_check.yaml lists it first)."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="gpu_check_job", node=GpuCheckJob)
