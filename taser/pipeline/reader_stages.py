"""A reader row's stages (DPR's Table 4), over a row's `RowRun`: the training questions as a QA file,
their retrieval by the row's retriever, the reading-comprehension stage (shared by every reader row
and seed whose settings match), the open-domain stage at the row's seed, and the reading of the
evaluation questions (`read_stage`, also the table's `read.reader` on any row's retrieval)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from taser.pipeline.stage_settings import reader_train_key
from taser.pipeline.stages import Stage
from taser.pipeline.table import RowSpec

RowRun = Any  # taser.pipeline.rows.RowRun, not imported: rows imports this module (no module imports one that imports it back)


def reader_gold(run: RowRun) -> tuple[Path, dict]:
    """The training questions' file (bi-encoder JSON: each first positive is its gold passage) and its identity."""
    files = run.data()["train_files"]
    if len(files) != 1:
        raise ValueError(f"table {run.table.name}, row {run.job.row}: a reader trains on one training file of questions; the "
                         f"table's data has {len(files)} ({', '.join(map(str, files))})")
    return Path(files[0]), run.identity(Path(files[0]))


def train_questions(run: RowRun) -> Stage:
    """The training questions (and answers) as a QA file, for the retrievers to retrieve their passages."""
    source, source_id = reader_gold(run)
    return run.training_questions(source, source_id, run.table.reader_training.limit_train_questions)


def reader_model(run: RowRun) -> dict:
    spec = run.table.reader_training
    from taser.models.pretrained import SHIPPED_MODEL

    return {"pretrained": spec.pretrained or SHIPPED_MODEL, "max_length": spec.max_length, "max_question_length": spec.max_question_length,
            "max_answer_length": spec.max_answer_length}


def reading_reader(run: RowRun) -> Stage | None:
    """The reading-comprehension stage (gold passages alone): keyed by its data and settings only, so
    every reader row and seed of the table shares it; None when the table trains without one."""
    spec = run.table.reader_training
    if spec.reading is None:
        return None
    gold, gold_id = reader_gold(run)
    train = {**spec.reading, "stage": "reading"}
    settings = {"model": reader_model(run), "train": reader_train_key(train, threads=not run.store.planned)}

    def build(d: Path) -> None:
        train_reader_stage(reader_model(run), None, train, str(gold), None, run.match(), d, run.job.progress, run.processes())

    return run.stage("reader: reading comprehension", "reader-reading", settings, {"gold": gold_id}, build)


def source_reader(run: RowRun, row: RowSpec, seed: int) -> Stage | None:
    """The reader a reader row starts from: the reader of the row it names in `reader_from` (trained on
    that row's own data, at the same seed), else the table's reading stage (None: none, from the encoder)."""
    if row.reader_from is None:
        return reading_reader(run)
    job = copy.copy(run.job)
    job.row = row.reader_from
    source = type(run)(job, run.store)  # a RowRun of the source row: its own data (another dataset's training questions)
    stage = trained_reader(source, run.table.rows[row.reader_from], seed)
    for label, built in source.stages:  # the source's stages are this job's too (its record lists them)
        if all(built.key != s.key for _, s in run.stages):
            run.stages.append((label, built))
            run.owners.setdefault(built.key, source.owners.get(built.key, row.reader_from))
    return stage


def trained_reader(run: RowRun, row: RowSpec, seed: int) -> Stage:
    """The reader row's reader: the open-domain stage on its retriever's top passages of the training
    questions, at the row's seed, from the reader of the row it names in `reader_from`, else from the
    reading stage when the table has one; its settings the table's `open_domain` with the row's `reader` over them."""
    spec, retriever = run.table.reader_training, run.table.rows[row.uses]
    questions = train_questions(run)
    retrieved = run.retrieve(retriever, seed, f"retrieve training questions ({retriever.name})", "retrieve-train",
                              questions.dir / "questions.qa.tsv", questions.key, spec.retrieve_k)
    start = source_reader(run, row, seed)
    gold, gold_id = reader_gold(run)
    train = {**spec.open_domain, **row.reader, "stage": "open_domain", "seed": seed, "name": row.name}
    inputs = {"retrieval": retrieved.key, "gold": gold_id, "init": start.key if start else None}
    settings = {"model": reader_model(run), "train": reader_train_key(train, threads=not run.store.planned)}

    def build(d: Path) -> None:
        init = str(start.dir / "final") if start else None
        train_reader_stage(reader_model(run), init, train, str(gold), str(retrieved.dir / "retrieval.json"), run.match(),
                           d, run.job.progress, run.processes())

    return run.stage(f"train {row.name}", "reader", settings, inputs, build, owner=row)


def read_stage(run: RowRun, evaluated: Stage, trained: Stage | None = None, name: str | None = None) -> Stage:
    """A reader on the row's retrieval (evaluate's retrieval.json): the table's reader checkpoint
    (`read.reader`), or a reader row's own `trained` reader stage."""
    from taser.pipeline.reader import read
    from taser.reader.config import ReadJob
    from taser.runtime import resolve_precision

    spec, table = run.table.read, run.table
    checkpoint = str(trained.dir / "final") if trained else spec.reader
    settings = {"ks": list(spec.ks), "max_answer_length": spec.max_answer_length, "match": run.match(),
                "precision": resolve_precision(spec.precision, spec.device)}
    reader_id = trained.key if trained else run.identity(Path(spec.reader) / "model.safetensors")
    inputs = {"reader": reader_id, "retrieval": evaluated.key}
    if name:
        settings["name"] = name
    dataset = table.data_of(table.row(run.job.row)).dataset
    job = lambda d: read(ReadJob(checkpoint=checkpoint, retrieval=str(evaluated.dir / "retrieval.json"), out_dir=str(d), ks=list(spec.ks),
                                 match=run.match(), max_answer_length=spec.max_answer_length, batch_size=spec.batch_size,
                                 precision=spec.precision, device=spec.device, progress=run.job.progress, dataset=dataset, name=name))
    return run.stage("read", "read", settings, inputs, job)


def train_reader_stage(model: dict, init: str | None, train: dict, gold: str, retrieval: str | None, match: str, out: Path, progress: bool,
                       processes: int | None = None) -> None:
    """Train a reader into the stage directory `out` (resumed from its last checkpoint after a kill):
    on `processes` torchrun ranks (None: one per visible GPU) when several, the stage's `batch_size`
    questions of a step (its global batch, in its key) split between them, as DPR's DataParallel split
    its 16 x 24 passages over 8 GPUs: 2 questions each."""
    from taser.pipeline import process_tree
    from taser.training.checkpoint import remove_checkpoint

    if processes is None:
        import torch

        processes = torch.cuda.device_count() if torch.cuda.is_available() else 1

    if processes > 1:
        if train["batch_size"] % processes:
            raise ValueError(f"a reader's batch of {train['batch_size']} questions does not split over {processes} processes: give a "
                             f"multiple of {processes}, or processes=<a divisor of {train['batch_size']}>")
        spec = {"model": model, "init": init, "train": {**train, "batch_size": train["batch_size"] // processes}, "gold": gold,
                "retrieval": retrieval, "match": match, "out": str(out), "progress": False}
        process_tree.run_torchrun("taser.pipeline.reader_train_worker", spec, out / "torchrun-spec.json", processes, "training the reader",
                     f"the last checkpoint in {out}")
    else:
        train_reader_here(model, init, train, gold, retrieval, match, out, progress)
    remove_checkpoint(out / "checkpoint")  # the resumable state: done with once final/ is written


def train_reader_here(model: dict, init: str | None, train: dict, gold: str, retrieval: str | None, match: str, out: Path, progress: bool) -> None:
    """One process's part of a reader stage (the only one, or a torchrun rank): `train["batch_size"]` per process."""
    from taser.pipeline.reader import train_reader
    from taser.reader.config import ReaderModelSettings, ReaderTrainConfig, TrainReaderJob

    settings = ReaderModelSettings(init_checkpoint=init, **model) if init else ReaderModelSettings(**model)
    if init:
        settings.pretrained = None
    job = TrainReaderJob(settings, ReaderTrainConfig(**{**train, "resume": True, "progress": progress}), train_file=retrieval, gold_file=gold,
                         match=match, output_dir=str(out))
    train_reader(job)
