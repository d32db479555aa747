"""The `data` block of the scripts' configs: where a dataset is (local files, the default, or
datasets of the Hugging Face hub), how training reads it, and how answers match."""

from __future__ import annotations

from dataclasses import dataclass, field

from taser.choice import Choice
from taser.data.hub import HubSplit


class Match(Choice):
    string = "string"  # DPR's rule: the answer's tokens as a contiguous run of the passage's
    regex = "regex"  # each answer is a regular expression (CuratedTREC)


class DataSource(Choice):
    local = "local"  # train_files, dev_file, passages, qa_file: files in DPR's formats
    hub = "hub"  # data.hub.*: datasets of the Hugging Face hub (or their local copies), through `datasets`


class TrainReader(Choice):
    json = "json"  # DPR's JSON read in place: each rank indexes the records' byte offsets (16 bytes a record) and parses one when needed
    arrow = "arrow"  # the JSON converted once into an Arrow file (cached), memory-mapped and shared by every rank and data worker


@dataclass
class HubData:
    """`data.source=hub`: each part a dataset (`name`, `config`, `split`; taser.data.hub.HubSplit)."""

    train: list[HubSplit] = field(default_factory=list)  # training sets in DPR's or Tevatron's layout (several: multi-set)
    # each of these is not given while its name is empty
    dev: HubSplit = field(default_factory=HubSplit)  # validation during training (same layouts)
    passages: HubSplit = field(default_factory=HubSplit)  # a corpus: id_column, text, title (Tevatron's wikipedia-nq-corpus: docid)
    qa: HubSplit = field(default_factory=HubSplit)  # evaluation questions: question_column and answers_column (nq_open: question, answer)
    question_column: str = "question"
    answers_column: str = "answer"  # a list of strings; a dotted name reaches into a struct (TriviaQA: answer.aliases)
    id_column: str = "docid"  # of the corpus (BEIR's corpora: _id)
    cache_dir: str | None = None  # datasets' cache (None: HF_DATASETS_CACHE, under HF_HOME)
    work_dir: str = "outputs/hub"  # the corpus written once as a passages TSV (what BM25, encoding and indexes read)

    def __post_init__(self):  # from Python, a part may be given as a dict
        split = lambda v: HubSplit(**v) if isinstance(v, dict) else v  # noqa: E731
        self.train = [split(v) for v in self.train]
        self.dev, self.passages, self.qa = split(self.dev), split(self.passages), split(self.qa)


@dataclass
class DataConfig:
    source: DataSource = DataSource.local
    data_dir: str | None = None
    train_files: list[str] = field(default_factory=list)  # bi-encoder JSON files (several: multi-set)
    sampling_rates: list[float] | None = None  # per training file (multi-set)
    dev_file: str | None = None  # a bi-encoder JSON for validation during training
    passages: str | None = None  # the corpus TSV (id, text, title)
    qa_file: str | None = None  # the evaluation questions (QA TSV)
    dataset: str | None = None  # the evaluation questions' name in results and reports (None: the QA file's name, nq-test)
    match: Match = Match.string
    train_reader: TrainReader = TrainReader.json  # local training files: read in place (json) or through a memory-mapped Arrow copy
    arrow_cache_dir: str | None = None  # train_reader=arrow: where the Arrow copies go (None: beside each JSON file)
    hub: HubData = field(default_factory=HubData)

    def __post_init__(self):
        self.match = Match.parse(self.match, "data.match")
        self.source = DataSource.parse(self.source, "data.source")
        self.train_reader = TrainReader.parse(self.train_reader, "data.train_reader")
        if isinstance(self.hub, dict):
            self.hub = HubData(**self.hub)
        train = self.hub.train if self.source == DataSource.hub else self.train_files
        if self.sampling_rates is not None and len(self.sampling_rates) != len(train):
            where = "data.hub.train" if self.source == DataSource.hub else "data.train_files"
            raise ValueError(f"data.sampling_rates has {len(self.sampling_rates)} rates for {len(train)} {where}")
