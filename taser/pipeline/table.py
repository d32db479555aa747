"""A paper's table as settings (`configs/table/<name>.yaml`): its data, the settings every row shares,
and its rows, each a chain of stages with its own settings and the figures the paper reports for it.
`scripts/experiment.py` runs one (row, seed) per job; a table's sweep (`-m`) runs them all. No torch
here: a typo in a row's name is refused in a second, before anything loads."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING

from taser.choice import Choice


class RowKind(Choice):
    trained = "trained"  # train (on BM25 or dense-mined negatives), encode, index, evaluate dense retrieval
    zero_shot = "zero_shot"  # the untrained model: encode, index, evaluate
    bm25 = "bm25"  # BM25 alone
    hybrid = "hybrid"  # BM25 fused with the trained model of the row named in `uses`
    reader = "reader"  # a reader trained on the passages of the retriever row named in `uses` (table.reader_training), reading its retrieval


class Negatives(Choice):
    bm25 = "bm25"  # BM25's top passages without an answer, mined once for the table
    dense = "dense"  # mined with the trained model of the row named in `uses` (same seed)
    given = "given"  # the training files' own hard negatives (DPR's files carry BM25's)


class Positives(Choice):
    gold = "gold"  # the training files' own positives (a question without one: its distant positive, found while mining)
    distant = "distant"  # every question's positive: the best answer-bearing passage of the mining retriever (DPR Table 5), given ones set aside


class JobPhase(Choice):
    row = "row"  # the row's whole chain of stages, then its results
    prepare = "prepare"  # only the row's CPU stages (data, BM25 index, BM25-mined negatives): a table's sweep runs them on CPU jobs first


# The one default data root: where scripts/download.py puts DPR's files, in DPR's layout (`data.retriever.nq-train` at
# <root>/data/retriever/nq-train.json). DownloadJob and DataSpec default to it; configs/data/nq.yaml's data_dir (DPR's
# `data` directory: <root>/data, or $DPR_DATA_DIR) and configs/table/*.yaml repeat it, held to it by tests/test_data_root.py.
DATA_ROOT = "data/downloads"


class DataKind(Choice):
    squad = "squad"  # a SQuAD JSON split into the shipped protocol (passages, training and evaluation questions)
    files = "files"  # DPR's files under data_dir (fetched with scripts/download.py)


@dataclass
class RowSpec:
    name: str = MISSING  # the system's name in results.json and the report
    kind: RowKind = RowKind.trained
    model: dict[str, Any] = field(default_factory=dict)  # over the table's model settings
    train: dict[str, Any] = field(default_factory=dict)  # over the table's training settings
    negatives: Negatives = Negatives.bm25
    positives: Positives = Positives.gold  # distant: found by the retriever that mines the negatives (negatives bm25 or dense)
    uses: str | None = None  # hybrid, negatives=dense: the row whose trained model (at the same seed) it uses; reader: its retriever row
    data: dict[str, Any] = field(default_factory=dict)  # over the table's data settings (a table of several datasets: DPR's Table 4)
    train_files: list[str] | None = None  # data kind files: this row's training files (multi-set) instead of the table's
    candidates: int | None = None  # hybrid: each retriever's top-N fused (DPR fused the top-2000; None: evaluate.k)
    reference: dict[str, float | None] = field(default_factory=dict)  # the paper's figures, e.g. {"top20": 78.4}; {}: not reported
    cites: str | None = None  # the entry of taser/evaluation/reference_figures.yaml those figures are (its source); set with `reference`
    reader: dict[str, Any] = field(default_factory=dict)  # reader rows: over table.reader_training.open_domain (e.g. this dataset's batch)
    reader_from: str | None = None  # reader rows: another reader row whose reader (same seed) this one fine-tunes (DPR Table 4's Multi)

    def __post_init__(self):
        self.kind = RowKind.parse(self.kind, "row.kind")
        self.negatives = Negatives.parse(self.negatives, "row.negatives")
        self.positives = Positives.parse(self.positives, "row.positives")
        if self.positives == Positives.distant and self.negatives == Negatives.given:
            raise ValueError(f"row {self.name}: positives=distant are found by the retriever that mines the row's negatives; with "
                             "negatives=given nothing is mined: set negatives to bm25 (DPR's distant supervision) or dense")
        if (self.reader or self.reader_from) and self.kind != RowKind.reader:
            raise ValueError(f"row {self.name}: reader and reader_from are settings of reader rows (kind: reader), not of {self.kind} rows")
        if self.candidates is not None and (self.kind != RowKind.hybrid or self.candidates < 1):
            raise ValueError(f"row {self.name}: candidates (each retriever's top-N fused) is a setting of hybrid rows, >= 1; got {self.candidates}")

    @property
    def seeded(self) -> bool:
        return self.kind in (RowKind.trained, RowKind.hybrid, RowKind.reader)


@dataclass
class DataSpec:
    kind: DataKind = DataKind.squad
    dataset: str = "SQuAD"  # the dataset's name in results.json and the report
    squad_json: str | None = None  # kind squad
    train_articles: int = 30  # kind squad: the first N articles train, the rest evaluate
    articles: int | None = None  # kind squad: only the first N articles of squad_json (None: all; a smoke run: 8)
    limit_questions: int | None = None  # evaluate only the first N questions (smoke runs)
    limit_passages: int | None = None  # retrieve from the first N passages only (smoke runs: not the paper's corpus)
    data_dir: str = DATA_ROOT  # kind files: where scripts/download.py puts the resources
    train_files: list[str] = field(default_factory=list)  # kind files: names under data_dir (bi-encoder JSON)
    qa_file: str | None = None  # kind files: the evaluation questions (QA TSV) under data_dir
    passages: str | None = None  # kind files: the passages TSV under data_dir
    resources: list[str] = field(default_factory=list)  # what scripts/download.py fetches for this table
    match: str | None = None  # how answers are matched on this dataset (regex: CuratedTREC); None: table.evaluate.match

    def __post_init__(self):
        self.kind = DataKind.parse(self.kind, "table.data.kind")
        if self.kind == DataKind.squad and not self.squad_json:
            raise ValueError("table.data.squad_json is needed for data kind squad")
        if self.kind == DataKind.squad and self.articles is not None and not 0 < self.train_articles < self.articles:
            raise ValueError(f"table.data: train_articles ({self.train_articles}) must leave evaluation articles among the first "
                             f"{self.articles} (articles)")
        if self.kind == DataKind.files and not (self.train_files and self.qa_file and self.passages):
            raise ValueError("table.data: kind files needs train_files, qa_file and passages (names under data_dir)")


@dataclass
class EvaluateSpec:
    k: int = 100
    match: str = "string"  # regex for CuratedTREC
    batch_size: int = 128
    precision: str = "auto"  # encoding precision (auto: from the hardware)
    device: str = "auto"
    bm25: dict[str, Any] = field(default_factory=lambda: {"backend": "pyserini", "k1": 0.9, "b": 0.4})
    chunk_size: int = 10_000  # passages encoded per file: a killed encoding continues from the last whole one
    mine_top_n: int = 100  # mined negatives: from the first N passages without an answer
    mine_negatives: int = 30


@dataclass
class ReadSpec:
    """The reader on each row's retrieval (DPR's end-to-end EM): off unless `reader` names a reader checkpoint."""

    reader: str | None = None  # a reader checkpoint directory (scripts/train_reader.py's final/ or best/, an imported DPR reader)
    ks: list[int] = field(default_factory=lambda: [1, 5, 20])  # passages read: EM/F1 at each
    max_answer_length: int = 10
    batch_size: int = 32
    precision: str = "auto"
    device: str = "auto"


@dataclass
class ReaderTrainingSpec:
    """How a reader row's reader is trained (DPR's Table 4): an optional reading-comprehension stage on the
    training questions' gold passages (shared by every reader row and seed of the table whose settings
    match), then the open-domain stage on the row's retriever's top passages of the training questions
    (the gold passage as the positive where the training file knows it), at the row's seed. Each stage
    trains on every GPU of its job (torchrun, one rank each); its `batch_size` is the step's questions
    in all (its global batch), split between the ranks as DPR's DataParallel split them."""

    pretrained: str | None = None  # a BERT-family encoder (None: the shipped MiniLM)
    max_length: int = 256
    max_question_length: int = 64
    max_answer_length: int = 10
    retrieve_k: int = 100  # the training questions' passages retrieved by the row's retriever (DPR: 100)
    reading: dict[str, Any] | None = None  # ReaderTrainConfig settings of the reading-comprehension stage; None: none (DPR's recipe)
    open_domain: dict[str, Any] = field(default_factory=dict)  # ReaderTrainConfig settings of the open-domain stage (seed: the row's)
    limit_train_questions: int | None = None  # train on the first N training questions only (smoke runs)

    def __post_init__(self):
        for name in ("max_length", "max_question_length", "max_answer_length", "retrieve_k"):
            if getattr(self, name) < 1:
                raise ValueError(f"table.reader_training.{name} must be >= 1, got {getattr(self, name)}")
        if self.limit_train_questions is not None and self.limit_train_questions < 1:
            raise ValueError(f"table.reader_training.limit_train_questions must be >= 1 or null (all), got {self.limit_train_questions}")
        for name, settings, set_here in (("reading", self.reading or {}, {"stage", "resume", "progress"}),
                                         ("open_domain", self.open_domain, {"stage", "seed", "resume", "progress"})):
            if set_here & set(settings):
                raise ValueError(f"table.reader_training.{name}: {', '.join(sorted(set_here & set(settings)))} is set by the table "
                                 "(the open-domain stage trains at the row's seed; the reading stage's own seed is shared by every row)")


@dataclass
class TableSpec:
    name: str = MISSING
    title: str = MISSING
    reference_source: str = ""  # where the reference figures come from (paper, table)
    data: DataSpec = MISSING
    model: dict[str, Any] = field(default_factory=dict)  # every row's model settings (taser.models.settings.ModelSettings)
    train: dict[str, Any] = field(default_factory=dict)  # every trained row's settings (taser.training.config.TrainConfig)
    evaluate: EvaluateSpec = field(default_factory=EvaluateSpec)
    read: ReadSpec = field(default_factory=ReadSpec)
    reader_training: ReaderTrainingSpec = field(default_factory=ReaderTrainingSpec)  # reader rows' readers
    seeds: list[int] = field(default_factory=lambda: [1, 2, 3])  # must equal the sweep's seeds (hydra.sweeper.params.seed)
    # training processes a row is documented for: with train.batch_size (per process) and grad_accumulation, the paper's global batch
    processes: int = 1
    report_ks: list[int] = field(default_factory=lambda: [20, 100])  # the report's top-k columns for this table
    time_estimate: str = ""  # how long the whole sweep takes, on what, and where that figure comes from
    rows: dict[str, RowSpec] = field(default_factory=dict)

    def __post_init__(self):
        if isinstance(self.data, dict):
            self.data = DataSpec(**self.data)
        if isinstance(self.evaluate, dict):
            self.evaluate = EvaluateSpec(**self.evaluate)
        if isinstance(self.read, dict):
            self.read = ReadSpec(**self.read)
        if isinstance(self.reader_training, dict):
            self.reader_training = ReaderTrainingSpec(**self.reader_training)
        self.rows = {key: row if isinstance(row, RowSpec) else RowSpec(**row) for key, row in self.rows.items()}
        if not self.rows:
            raise ValueError(f"table {self.name} has no rows")
        if not self.seeds:
            raise ValueError(f"table {self.name} has no seeds")
        from taser.evaluation.reference_figures import check_row_reference

        for key, row in self.rows.items():
            check_row_reference(f"table {self.name}, row {key}", row.cites, row.reference)
            needs_uses = row.kind == RowKind.hybrid or row.negatives == Negatives.dense
            if needs_uses and row.uses not in self.rows:
                raise ValueError(f"table {self.name}, row {key}: uses={row.uses!r} must name another row of the table "
                                 f"({', '.join(self.rows)}) whose trained model it uses")
            if needs_uses and self.rows[row.uses].kind != RowKind.trained:
                raise ValueError(f"table {self.name}, row {key}: uses={row.uses} is not a trained row")
            if row.kind == RowKind.reader:
                retriever = self.rows.get(row.uses)
                if retriever is None or retriever.kind == RowKind.reader:
                    raise ValueError(f"table {self.name}, row {key}: a reader row's uses={row.uses!r} must name a retriever row of the "
                                     f"table ({', '.join(k for k, r in self.rows.items() if r.kind != RowKind.reader)}) whose passages it reads")
            if row.reader_from is not None:
                self._check_reader_from(key)
            if row.uses in self.rows and self.rows[row.uses].data != row.data:
                raise ValueError(f"table {self.name}, row {key}: its data settings differ from those of the row it uses ({row.uses}): "
                                 "a row uses another row's model or passages on the same dataset")

    def _check_reader_from(self, key: str) -> None:
        """A reader row fine-tunes another reader row's reader: one that exists, is a reader row, and never leads back to it."""
        chain = [key]
        while (source := self.rows[chain[-1]].reader_from) is not None:
            if source not in self.rows or self.rows[source].kind != RowKind.reader:
                readers = ", ".join(k for k, r in self.rows.items() if r.kind == RowKind.reader and k != key)
                raise ValueError(f"table {self.name}, row {chain[-1]}: reader_from={source!r} must name another reader row of the table "
                                 f"({readers or 'it has none'}) whose reader it fine-tunes")
            if source in chain:
                raise ValueError(f"table {self.name}, row {key}: reader_from goes round in a circle ({' -> '.join([*chain, source])})")
            chain.append(source)

    def data_of(self, row: RowSpec) -> DataSpec:
        """The row's data: the table's, with the row's own settings over it."""
        if not row.data:
            return self.data
        from dataclasses import asdict

        return DataSpec(**{**asdict(self.data), **row.data})

    def global_batch(self, row: RowSpec | None = None) -> int:
        """Questions per optimiser step of a trained row (default: the table's settings) on the
        documented `processes`: per-process batch x processes x accumulation."""
        train = {**self.train, **(row.train if row else {})}
        return int(train.get("batch_size", 16)) * self.processes * int(train.get("grad_accumulation", 1))

    def row(self, key: str) -> RowSpec:
        if key not in self.rows:
            raise ValueError(f"unknown row {key!r} in table {self.name}; its rows: {', '.join(self.rows)}")
        return self.rows[key]


@dataclass
class ExperimentJob:
    table: TableSpec = MISSING  # configs/table/<name>.yaml
    row: str = MISSING  # a key of table.rows (the sweep sets it; on the command line: row=dpr)
    seed: int = 1  # training seed (rows without training ignore it and report one result)
    stages_dir: str = "outputs/experiments/stages"  # every stage's output, shared by rows, seeds, jobs and tables
    out_dir: str = "outputs/experiments/run"  # this job's results.json, per_query.jsonl and experiment.json (the sweep sets it)
    progress: bool = False  # progress lines of the stages
    # training processes (torchrun, one per GPU) of this job; null: every visible GPU when there are several, else 1.
    # train.batch_size is per process, as under torchrun.
    processes: int | None = None  # training ranks of this job (torchrun), e.g. its GPUs
    # a smoke run of any table: every trained row this many steps, the first 100 questions over the first 20,000 passages
    # (a SQuAD-protocol table: its first 8 articles, 6 of them training); it checks the whole chain in minutes, its stages
    # have keys of their own, and its figures are not the paper's. With a row subset: -m ... smoke_steps=2 row=bm25,dpr seed=1
    smoke_steps: int | None = None  # a quick pass of the table: this many training steps and a few questions/passages per row
    phase: JobPhase = JobPhase.row  # set by the table's sweeper
    # set by the table's sweeper: this job builds only its own row's stages, fails at once on a stage another live job
    # builds (the driver waits for it, outside any allocation) and refuses to train another row's model it does not find
    scheduled: bool = False  # set by the table's sweeper: a job it launched

    def __post_init__(self):
        self.phase = JobPhase.parse(self.phase, "phase")
        if self.processes is not None and self.processes < 1:
            raise ValueError(f"processes must be >= 1 or null (one per visible GPU), got {self.processes}")
        if isinstance(self.table, dict):
            self.table = TableSpec(**self.table)
        row = self.table.row(self.row)  # a typo is refused here, before anything loads
        if self.smoke_steps is not None:
            if self.smoke_steps < 1:
                raise ValueError(f"smoke_steps must be >= 1 (training steps per row) or null, got {self.smoke_steps}")
            self.table.train = {**self.table.train, "max_steps": self.smoke_steps, "warmup_steps": min(int(self.table.train.get("warmup_steps", 0)), 1)}
            data = self.table.data
            if data.kind == DataKind.squad:
                data.articles = min(data.articles or SMOKE_ARTICLES, SMOKE_ARTICLES)
                data.train_articles = min(data.train_articles, data.articles - 2)
            data.limit_questions = min(data.limit_questions or SMOKE_QUESTIONS, SMOKE_QUESTIONS)
            data.limit_passages = min(data.limit_passages or SMOKE_PASSAGES, SMOKE_PASSAGES)
            reader = self.table.reader_training
            reader.limit_train_questions = min(reader.limit_train_questions or SMOKE_QUESTIONS, SMOKE_QUESTIONS)
            reader.open_domain = {**reader.open_domain, "max_steps": self.smoke_steps, "warmup_steps": 0}
            if reader.reading is not None:
                reader.reading = {**reader.reading, "max_steps": self.smoke_steps, "warmup_steps": 0}
        check_row_settings(self.table, row)


SMOKE_QUESTIONS, SMOKE_PASSAGES = 100, 20_000
SMOKE_ARTICLES = 8  # a SQuAD-protocol table's smoke run: its first 8 articles (make quickstart's corpus), the last 2 evaluating


def check_row_settings(table: TableSpec, row: RowSpec) -> None:
    """The row's model and training settings through their schemas (torch-free): a misspelt key or a
    bad value in a table or an override is refused with the row's name, before any job starts."""
    from taser.models.settings import ModelSettings
    from taser.training.config import TrainConfig

    where = f"table {table.name}, row {row.name}"
    try:
        ModelSettings.from_value({**table.model, **row.model})
        if row.kind == RowKind.trained:
            TrainConfig.from_value({**table.train, **row.train})
        if row.kind == RowKind.reader:
            from taser.reader.config import ReaderTrainConfig

            ReaderTrainConfig(**{**table.reader_training.open_domain, **row.reader, "seed": 1})
            if table.reader_training.reading is not None:
                ReaderTrainConfig(**{**table.reader_training.reading, "stage": "reading"})
    except (ValueError, TypeError) as error:
        raise ValueError(f"{where}: {error}") from error
