"""The schema of each script's config: Hydra validates every key, type and choice against these
when it composes a config (a misspelt key, `batch_size=eight` or `precision=bf61` stops there,
naming the key and the allowed values), and `__post_init__` checks the rest before any model,
data or index is loaded. Defaults live here; `configs/*.yaml` hold values and interpolations.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING

from taser.choice import Choice
from taser.data.config import DataConfig, DataSource, Match
from taser.evaluation.comparison import StatsSettings
from taser.evaluation.runs import check_beir_metrics
from taser.models.backends import Backend
from taser.models.convert.conversions import Conversion, check_arguments
from taser.models.pretrained import resolve_pretrained
from taser.models.settings import ModelSettings
from taser.pipeline.evaluate import Retriever, RetrieverSettings
from taser.pipeline.table import DATA_ROOT, ExperimentJob
from taser.precision import Precision
from taser.retrieval.bm25 import BM25Settings
from taser.retrieval.hybrid import DPR_LAMBDA, HybridRule
from taser.retrieval.index_types import IndexConfig, SearchSettings
from taser.training.config import TrainConfig


class EvalTask(Choice):
    qa = "qa"  # a QA file over a passages TSV: top-k accuracy (DPR)
    beir = "beir"  # a BEIR dataset directory: nDCG@10, Recall@100, MRR@10
    entity_questions = "entity_questions"  # EntityQuestions' relation files over a passages TSV: top-k per relation, macro average


class VectorDtype(Choice):
    float32 = "float32"
    float16 = "float16"


class MiningRetriever(Choice):
    bm25 = "bm25"
    dense = "dense"


@dataclass
class HybridSettings:
    dense_weight: float = DPR_LAMBDA  # λ: fused score = bm25 + λ * dense (DPR: 1.1)
    rule: HybridRule = HybridRule.dpr
    candidates: int | None = None  # top-N of each retriever fused (None: k)


@dataclass
class BeirSettings:
    dir: str | None = None  # the dataset directory: corpus.jsonl, queries.jsonl, qrels/<split>.tsv
    hub: str | None = None  # or a hub dataset: BeIR/<name> (configs corpus, queries) with BeIR/<name>-qrels, or a local mirror (taser.data.hub_beir)
    split: str = "test"
    ignore_identical_ids: bool = True  # BEIR's default: drop a hit whose doc id is its query id
    work_dir: str | None = None  # the corpus as a passages TSV and its BM25 index (None: outputs/beir/<dataset directory name>)


@dataclass
class EntityQuestionsSettings:
    dir: str | None = None  # the split's directory of <relation>.<split>.json[l] files (or its parent)
    split: str = "test"
    write_json: bool = True  # each relation's DPR retrieval JSON under out_dir/retrieval/


@dataclass
class TrainJob:
    model: ModelSettings = field(default_factory=ModelSettings)  # the model (model=dpr, shared, taser, taser_seq, taser_token, taser_attention)
    data: DataConfig = field(default_factory=DataConfig)  # the training data (data=squad, nq, trivia, multiset, nq_hub)
    train: TrainConfig = field(default_factory=TrainConfig)  # the training run: batch, negatives, loss, steps, precision, ...
    output_dir: str = MISSING  # the checkpoints (final/), logs and train_summary.json

    def __post_init__(self):
        if self.model.init_checkpoint is None:
            resolve_pretrained(self.model.source)  # a mistyped local model path fails here, before torch is imported
        rates = self.data.sampling_rates  # a dataset's (data=multiset) unless train.sampling_rates says otherwise
        if rates is not None and self.train.sampling_rates is not None and list(rates) != list(self.train.sampling_rates):
            raise ValueError(f"data.sampling_rates={list(rates)} and train.sampling_rates={list(self.train.sampling_rates)} differ: set one")
        if rates is not None:
            self.train.sampling_rates = list(rates)


@dataclass
class EncodeJob:
    data: DataConfig = field(default_factory=DataConfig)  # the data config whose passages are encoded (data=squad)
    checkpoint: str = MISSING  # a checkpoint directory or a released model's hub name
    passages: str = MISSING  # the passages TSV (default: the data config's)
    out_dir: str = MISSING  # where the shards of vectors go (default: beside the checkpoint)
    shard_id: int | None = None  # None: torchrun's RANK (0 outside torchrun)
    num_shards: int | None = None  # None: torchrun's WORLD_SIZE (1 outside torchrun)
    batch_size: int | None = None  # None: one that fits the device (64 on a CPU)
    precision: Precision = Precision.auto  # auto (from the hardware), fp32, bf16, fp16
    backend: Backend = Backend.torch  # torch; onnx* (CPU, the `fast` extra); openvino* (CPU, the `openvino` extra); auto (taser.models.backends)
    chunk_size: int = 10_000  # passages per resumable chunk
    dtype: VectorDtype = VectorDtype.float32  # float16 halves the disk; indexes read float32
    offsets_cache: str | None = None  # keeps the passages file's row index for the next shard (large corpora)
    device: str = "auto"  # auto, cpu, cuda, cuda:1, ...

    def __post_init__(self):
        if (self.shard_id is None) != (self.num_shards is None):
            raise ValueError("give both shard_id and num_shards, or neither (torchrun's rank and world size)")
        if self.shard_id is not None and not 0 <= self.shard_id < self.num_shards:
            raise ValueError(f"shard_id must be in 0..{self.num_shards - 1} (num_shards={self.num_shards}), got {self.shard_id}")
        if self.chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {self.chunk_size}")


@dataclass
class IndexJob:
    embeddings: str = MISSING  # the encoded passages (taser-encode-passages' out_dir)
    out_dir: str = MISSING  # where the index is written
    index: IndexConfig = field(default_factory=IndexConfig)  # the index type and its parameters (index_preset=dpr_hnsw: DPR's HNSW)


@dataclass
class EvaluateJob:
    data: DataConfig = field(default_factory=DataConfig)  # the data config (its passages and QA file)
    task: EvalTask = EvalTask.qa  # qa (top-k on a QA file), beir, entity_questions
    retriever: Retriever = Retriever.dense  # dense, bm25, or hybrid
    checkpoint: str | None = None  # dense, hybrid: a taser checkpoint directory
    index: str | None = None  # dense, hybrid: its FAISS index over the passages (None: encode them into a flat index in out_dir)
    search: SearchSettings = field(default_factory=SearchSettings)  # dense, hybrid: search.ef_search, search.nprobe at load time (None: as built)
    qa_file: str | None = None  # task=qa (data.source=hub: data.hub.qa)
    passages: str | None = None  # task=qa, entity_questions (BEIR: converted from corpus.jsonl; data.source=hub: data.hub.passages)
    match: Match = Match.string  # how an answer is found in a passage: string (DPR's), regex (CuratedTREC)
    out_dir: str = MISSING  # results.json, per_query.jsonl, retrieval.json
    k: int = 100  # passages retrieved per question
    batch_size: int = 128  # questions encoded at once
    precision: Precision = Precision.auto  # auto (from the hardware), fp32, bf16, fp16
    backend: Backend = Backend.torch  # dense encoding of questions (and of passages when no index is given): taser.models.backends
    device: str = "auto"  # auto, cpu, cuda, ...
    bm25: BM25Settings = field(default_factory=BM25Settings)  # index_dir None: <data.data_dir or outputs>/bm25-<backend> (BEIR: in beir.work_dir)
    hybrid: HybridSettings = field(default_factory=HybridSettings)  # hybrid: the fusion's settings
    beir: BeirSettings = field(default_factory=BeirSettings)  # task=beir: the dataset (dir or hub), split, metrics
    entity_questions: EntityQuestionsSettings = field(default_factory=EntityQuestionsSettings)  # task=entity_questions: the dataset directory
    name: str | None = None  # the system's name in results.json and reports (None: from the retriever and model)
    dataset: str | None = None  # the dataset's name in reports (task=qa: data.dataset by default; None: the QA file's or BEIR directory's name)

    def __post_init__(self):
        if self.retriever != Retriever.bm25 and not self.checkpoint:
            raise ValueError(f"retriever={self.retriever} needs checkpoint=... (and index=..., or a flat index is built in out_dir)")
        if self.dataset is None and self.task == EvalTask.qa:
            self.dataset = self.data.dataset  # the data config's name for its questions (data=squad: SQuAD, as its table names it)
        if self.k < 1:
            raise ValueError(f"k must be >= 1, got {self.k}")
        hub = self.data.source == DataSource.hub
        passages = "data.hub.passages.name" if hub else "passages"
        needs = {EvalTask.qa: ("data.hub.qa.name", passages) if hub else ("qa_file", passages), EvalTask.beir: (),
                 EvalTask.entity_questions: ("entity_questions.dir", passages)}
        for key in needs[self.task]:
            value = self
            for attr in key.split("."):
                value = getattr(value, attr)
            if not value:
                raise ValueError(f"task={self.task} needs {key}=..." + (" (data.source=hub)" if key.startswith("data.hub") else ""))
        if self.task == EvalTask.beir and bool(self.beir.dir) == bool(self.beir.hub):
            raise ValueError("task=beir needs beir.dir=... (BEIR's files) or beir.hub=... (a hub dataset), one of them")
        if self.task == EvalTask.beir and not self.beir.work_dir:
            self.beir.work_dir = f"outputs/beir/{os.path.basename(os.path.normpath(self.beir.dir or self.beir.hub))}"
        if self.bm25.index_dir is None and self.task != EvalTask.beir:
            if hub:
                from taser.data.hub_qa import hub_corpus_dir

                self.bm25.index_dir = str(hub_corpus_dir(self.data.hub.passages, self.data.hub.work_dir) / f"bm25-{self.bm25.backend}")
            else:
                self.bm25.index_dir = f"{self.data.data_dir or 'outputs'}/bm25-{self.bm25.backend}"

    def retriever_settings(self) -> RetrieverSettings:
        """What retrieves, as every evaluation task takes it (`taser.pipeline.evaluate.retrieve`)."""
        h = self.hybrid
        return RetrieverSettings(self.retriever, self.checkpoint, self.index, self.bm25, h.dense_weight, h.rule, h.candidates,
                                 self.batch_size, self.precision, self.device, self.search, self.backend)


@dataclass
class ReportJob:
    runs: list[str] = MISSING  # results.json files, or directories searched for them
    out_dir: str = "outputs/report"  # report.md, the plots and the inspection pages
    ks: list[int] | None = None  # top-k columns of QA and EntityQuestions datasets (None: the runs' table's report_ks, else [1, 5, 20, 100])
    beir_metrics: list[str] = field(default_factory=lambda: ["nDCG@10"])  # columns of BEIR datasets
    title: str = "Retrieval results"  # the report's title
    baseline: str | None = None  # a system's name: every other system is tested against it on the per-question outcomes (marked †)
    alpha: float = 0.05  # significance level after Holm's correction over the table's comparisons
    resamples: int = 10_000  # of the paired randomization test and of the bootstrap intervals
    bootstrap: bool = True  # 95% bootstrap intervals in each cell (runs with per_query.jsonl): seeds then questions, or questions
    power: float = 0.8  # of the "smallest difference this table can see" section
    seeds_for: list[float] = field(default_factory=lambda: [1.0, 2.0])  # how many matched seeds would detect these differences (points)
    inspect: list[str] = field(default_factory=list)  # systems to inspect against the baseline: an HTML page each (questions that flipped)
    inspect_k: int = 20  # the top-k at which a question counts as found on the inspection pages

    def __post_init__(self):
        self.stats_settings()  # alpha and resamples checked here
        if not self.runs:
            raise ValueError("runs=[...] needs at least one results.json file or directory")
        if self.ks is not None and any(k < 1 for k in self.ks):
            raise ValueError(f"ks must be >= 1, got {list(self.ks)}")
        check_beir_metrics(self.beir_metrics)

    def stats_settings(self) -> StatsSettings:
        return StatsSettings(self.baseline, self.alpha, self.resamples, bootstrap=self.bootstrap, power=self.power, seeds_for=tuple(self.seeds_for))


@dataclass
class MineJob:
    data: DataConfig = field(default_factory=DataConfig)  # the data config (its passages)
    input: str = MISSING  # a bi-encoder JSON, or a QA TSV (distant supervision)
    passages: str = MISSING  # the passages TSV mined from
    output: str = MISSING  # the bi-encoder JSON written
    retriever: MiningRetriever = MiningRetriever.bm25  # bm25 or dense
    top_n: int = 100  # passages retrieved per question
    num_hard_negatives: int = 30  # hard negatives kept per question
    match: Match = Match.string  # how an answer is found in a passage: string, regex
    distant_positives: bool = False  # every question's positive: its retriever's best answer-bearing passage (DPR Table 5), given ones set aside
    block_size: int = 1000  # questions retrieved at once
    offsets_cache: str | None = None  # the passages file's row index, kept for the next run
    progress: bool = True  # a progress bar (a line every 30 s in a log)
    checkpoint: str | None = None  # dense
    index: str | None = None  # dense
    batch_size: int = 128  # dense: questions encoded at once
    precision: Precision = Precision.auto  # dense: auto, fp32, bf16, fp16
    backend: Backend = Backend.torch  # dense: the questions' encoding (taser.models.backends)
    device: str = "auto"  # dense: auto, cpu, cuda, ...
    bm25: BM25Settings = field(default_factory=BM25Settings)  # bm25: the backend and its k1, b

    def __post_init__(self):
        if self.retriever == MiningRetriever.dense and (not self.checkpoint or not self.index):
            raise ValueError("retriever=dense needs checkpoint=... and index=...")


@dataclass
class PrepareSquadJob:
    squad_json: str = "data/squad/squad-v1.1-dev-40-articles.json"  # the SQuAD JSON (the shipped 40 articles by default)
    out_dir: str = "outputs/data/squad"  # passages.tsv, train/dev JSON and QA TSVs
    train_articles: int = 30  # the first N articles train, the rest evaluate
    words_per_passage: int = 100  # passages of N words (DPR's 100)
    random_negatives: int = 10  # random negatives per training question
    seed: int = 0  # the random negatives' seed


@dataclass
class DemoJob:
    model: ModelSettings = field(default_factory=ModelSettings)  # the model trained (model=dpr, shared, taser...)
    train: TrainConfig = field(default_factory=TrainConfig)  # the training run's settings
    squad_json: str = "data/squad/squad-v1.1-dev-40-articles.json"  # the SQuAD JSON split into the corpus, training and evaluation questions
    train_articles: int = 30  # the first 30 articles train, the rest evaluate
    articles: int | None = None  # only the first N articles (None: all 40): a smaller corpus, a quicker run (make quickstart: 8)
    out_dir: str = "outputs/demo"  # results.md, the plot and every stage's files
    precision: Precision = Precision.auto  # encoding and evaluation
    use_bm25: bool = True  # the BM25 row, BM25 hard negatives and the hybrid row
    bm25: BM25Settings = field(default_factory=BM25Settings)  # the BM25 row's settings
    hybrid: HybridSettings = field(default_factory=HybridSettings)  # the hybrid row's settings


@dataclass
class ConvertJob:
    conversion: Conversion = MISSING  # import_hf_dpr, import_dpr_cp, import_taser, import_dpr_reader, export_hf_dpr, export_sentence_transformers, export_taser
    source: str = MISSING  # import: the foreign directory or file (import_hf_dpr: the DPRQuestionEncoder's); export: a taser checkpoint directory
    output: str = MISSING  # the directory written (an import's is a taser checkpoint)
    ctx_source: str | None = None  # import_hf_dpr: the DPRContextEncoder directory
    base_model: str | None = None  # import_dpr_cp, import_taser: the BERT model trained from (config, tokenizer); None: the file's record
    max_length: int | None = None  # imports: tokens read per question and passage; None: the file's sequence_length, else 256
    allow_pickle: bool = False  # imports: load pickled Python objects (DPR's and TASER's Hydra settings); runs code from the file
    overwrite: bool = False  # replace an existing output
    # export_taser: the transformers version TASER's code runs with; null: its environment.yml's pin (4.12.5), whose
    # BERT needs embeddings.position_ids in the file; 4.31 and later refuse that key (e.g. target_transformers=4.44)
    target_transformers: str | None = None  # export_sentence_transformers: the transformers version the export must load under (None: this one)

    def __post_init__(self):
        check_arguments(self.conversion, self.ctx_source, self.base_model, self.max_length, self.allow_pickle, self.target_transformers)


@dataclass
class DownloadJob:
    resource: Any = None  # a resource name (taser.data.resources, DPR's names, e.g. data.retriever.nq-train) or a list of them
    table: Any = None  # table=<name>: also every resource that table names (configs/table/<name>.yaml, its table.data.resources)
    data_dir: str = DATA_ROOT  # taser.pipeline.table.DATA_ROOT: where data=nq/trivia/multiset and the tables look
    list_resources: bool = False  # print the resources there are, and where each lands
    progress: bool = True  # a progress bar (a line every 30 s in a log)

    def __post_init__(self):
        from taser.data.resources import resource

        if self.resource is None:
            self.resource = []
        elif isinstance(self.resource, str):
            self.resource = [self.resource]
        else:
            self.resource = [str(r) for r in self.resource]
        for name in self.names():
            resource(name)  # an unknown name is refused here, listing the known ones
        if not (self.resource or self.table or self.list_resources):
            raise ValueError("name what to fetch: resource=<name> (list_resources=true shows them) or table=<a table of configs/table/>")

    def names(self) -> list[str]:
        table_resources = list(((self.table or {}).get("data") or {}).get("resources") or []) if isinstance(self.table, dict) else []
        return list(self.resource) + [n for n in table_resources if n not in self.resource]


@dataclass
class SearchJob:
    """taser-search: rank a corpus for queries without answers (taser.pipeline.search.Searcher)."""

    corpus: str = MISSING  # a DPR passages TSV (id, text, title), a JSONL of documents (_id/id, text/contents, title), or a BEIR directory
    queries: str = MISSING  # a TSV (id<TAB>text, DPR's question<TAB>answers, or text alone) or a JSONL (_id/id/qid, text/query/question)
    retriever: Retriever = Retriever.dense  # dense, bm25, or hybrid (bm25 + dense_weight * dense)
    checkpoint: str | None = None  # dense, hybrid: a checkpoint directory, or a released model's hub name (converted once, cached)
    allow_pickle: bool = False  # a released model kept as a pickle (TASER's pytorch_model.bin) is converted only when true
    k: int = 100  # passages ranked per query
    out_dir: str = MISSING  # run.trec and rankings.jsonl
    work_dir: str = "outputs/search/cache"  # what is built once and reused: the converted corpus, indexes
    dense_weight: float = DPR_LAMBDA  # hybrid: fused score = bm25 + dense_weight * dense
    bm25: BM25Settings = field(default_factory=BM25Settings)  # bm25, hybrid: backend (pyserini, bm25s), k1, b
    batch_size: int = 128  # queries (and passages) encoded at once
    precision: Precision = Precision.auto  # auto (from the hardware), fp32, bf16, fp16
    device: str = "auto"  # auto, cpu, cuda, ...
    tag: str = "taser"  # the TREC run's tag (its last column)

    def __post_init__(self):
        if self.k < 1:
            raise ValueError(f"k must be >= 1, got {self.k}")
        if self.retriever != Retriever.bm25 and not self.checkpoint:
            raise ValueError(f"retriever={self.retriever} needs a checkpoint (a directory or a released model's hub name)")


SCHEMAS = {
    "train_job": TrainJob,
    "encode_job": EncodeJob,
    "index_job": IndexJob,
    "evaluate_job": EvaluateJob,
    "mine_job": MineJob,
    "prepare_squad_job": PrepareSquadJob,
    "demo_job": DemoJob,
    "report_job": ReportJob,
    "convert_job": ConvertJob,
    "experiment_job": ExperimentJob,
    "download_job": DownloadJob,
    "search_job": SearchJob,
}
