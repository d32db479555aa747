"""One row of a table at one seed: its chain of stages (data, BM25 index, negatives, training,
encoding and index, evaluation), each found in the stage store when another row, seed or job made
it with the same settings and inputs (`taser.pipeline.stages`), else built there; then the row's
`results.json` and `per_query.jsonl` in `retrieval/` of the job's directory (and the reader's in
`reader/`, when the table reads), where `scripts/report.py` finds them, and `experiment.json` (the
composed settings, the commit, the machine, each stage's key and time) beside them.

Rows without training (BM25, zero-shot) do not depend on the seed: their stages are shared by every
seed, and only the table's first seed writes their results (the report counts them once).
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import time
from dataclasses import asdict
from pathlib import Path

from taser.evaluation.per_query import PER_QUERY_FILE
from taser.evaluation.runs import RESULTS_FILE
from taser.io import atomic_open, atomic_path
from taser.pipeline.allocation import allocation
from taser.pipeline.machine_kinds import RecipeSplit, StageNotPlanned, at_most_one, found_elsewhere, machine_parts, training_recipe
from taser.pipeline.process_tree import run_torchrun
from taser.pipeline.stage_settings import model_key, train_key
from taser.pipeline.stages import CPU_KINDS, PrepareStore, Stage, StageStore, code_commit, file_identity, stage_key
from taser.pipeline.table import DataKind, ExperimentJob, JobPhase, Negatives, Positives, RowKind, RowSpec, TableSpec
from taser.shipped import shipped_file

log = logging.getLogger(__name__)

EXPERIMENT_FILE = "experiment.json"
PREPARE_FILE = "prepare.json"  # a prepare job's record (phase=prepare), in its own directory
RETRIEVAL_DIR, READER_DIR = "retrieval", "reader"  # under the job's directory: each holds a results.json and per_query.jsonl


class MissingData(FileNotFoundError):
    """A table's data file is not in data_dir: the message names the download command."""


class RowRun:
    """The stages of one (table, row, seed), in a store; each method returns its stage. With a
    `PlannedStore` nothing is built and files are named, not read: the table's stage graph."""

    def __init__(self, job: ExperimentJob, store: StageStore | None = None):
        self.job, self.table = job, job.table
        self.store = store or StageStore(job.stages_dir, wait=not job.scheduled)
        self.stages: list[tuple[str, Stage]] = []
        self.owners: dict[str, str] = {}  # stage key -> the row (key) whose own stage it is (train, initial, index, dense negatives)
        self._data: dict | None = None
        self._train_files: dict[tuple[str, int], tuple[list[str], list]] = {}

    def identity(self, path: Path) -> dict:
        """A file's identity in a key: its content (`file_identity`), or its name when only planning
        (a stage's output by its path in the store, which holds the stage's key: the file follows its stage's inputs)."""
        if self.store.planned:
            if path.is_relative_to(self.store.root):
                return {"stage_file": path.relative_to(self.store.root).as_posix()}
            root = Path(self.table.data_of(self.table.row(self.job.row)).data_dir)
            return {"file": str(path.relative_to(root)) if path.is_relative_to(root) else path.name}
        return file_identity(path)

    def stage(self, label: str, kind: str, settings: dict, inputs: dict, build, owner: RowSpec | None = None) -> Stage:
        """The stage of `kind` with these settings and inputs, found in the store or built there by
        `build`; recorded under `label` as one of this job's stages, owned by `owner` (default: the job's row)."""
        stage = self.store.run(kind, settings, inputs, build)
        if all(s.key != stage.key for _, s in self.stages):
            self.stages.append((label, stage))
        row = owner or self.table.row(self.job.row)
        self.owners.setdefault(stage.key, next(key for key, spec in self.table.rows.items() if spec is row))
        return stage

    # -- data ----------------------------------------------------------------------------
    def data(self) -> dict:
        """{passages, train_files, qa_file} and their identities (the inputs of later stages)."""
        if self._data is not None:
            return self._data
        spec = self.table.data_of(self.table.row(self.job.row))
        if spec.kind == DataKind.squad:
            squad = self.identity(shipped_file(spec.squad_json))
            from taser.data.squad import convert_squad, first_articles

            # `articles` keyed only when set: every stage of the whole corpus keeps its key
            subset = {} if spec.articles is None else {"articles": spec.articles}
            stage = self.stage("data", "squad", {"train_articles": spec.train_articles, **subset}, {"squad": squad},
                              lambda d: convert_squad(spec.squad_json if spec.articles is None else
                                                      first_articles(spec.squad_json, spec.articles, d / f"squad-first-{spec.articles}.json"),
                                                      d, train_articles=spec.train_articles))
            files = {"passages": stage.dir / "passages.tsv", "train_files": [stage.dir / "train.json"], "qa_file": stage.dir / "dev.qa.tsv"}
        else:
            root = Path(spec.data_dir)
            files = {"passages": root / spec.passages, "train_files": [root / f for f in spec.train_files], "qa_file": root / spec.qa_file}
            missing = [p for p in [files["passages"], files["qa_file"], *files["train_files"]] if not p.is_file()]
            if missing and not self.store.planned:
                raise MissingData(f"table {self.table.name} needs {', '.join(map(str, missing))}: fetch them with "
                                  f"taser-download {' '.join('resource=' + r for r in spec.resources) or 'resource=<name>'} "
                                  f"data_dir={spec.data_dir}")
        if spec.limit_questions:
            from taser.data.qa import read_qa, write_qa

            source = files["qa_file"]
            stage = self.stage("questions", "qa-subset", {"first": spec.limit_questions}, {"qa": self.identity(source)},
                              lambda d: write_qa(d / "questions.qa.tsv", list(read_qa(source))[: spec.limit_questions]))
            files["qa_file"] = stage.dir / "questions.qa.tsv"
        if spec.limit_passages:
            from itertools import islice

            from taser.data.passages import read_passages, write_passages

            source = files["passages"]
            stage = self.stage("passages", "passages-subset", {"first": spec.limit_passages}, {"passages": self.identity(source)},
                              lambda d: write_passages(d / "passages.tsv", islice(read_passages(source), spec.limit_passages)))
            files["passages"] = stage.dir / "passages.tsv"
        self._data = {**files, "ids": {"passages": self.identity(files["passages"]), "qa": self.identity(files["qa_file"])}}
        return self._data

    def match(self) -> str:
        """How an answer is matched in a passage on this row's dataset (regex for CuratedTREC)."""
        return self.table.data_of(self.table.row(self.job.row)).match or self.table.evaluate.match

    # -- BM25 ----------------------------------------------------------------------------
    def bm25(self) -> dict:
        """The table's BM25 settings with `index_dir`: the index of the passages, built once."""
        from taser.retrieval.bm25 import BM25Index, BM25Settings

        settings = BM25Settings.from_dict(self.table.evaluate.bm25)
        data = self.data()
        described = settings.describe()
        stage = self.stage("BM25 index", "bm25-index", described, {"passages": data["ids"]["passages"]},
                          lambda d: BM25Index.build(data["passages"], d / "index", backend=str(settings.backend), k1=settings.k1, b=settings.b,
                                                    threads=settings.threads).close())
        return {**self.table.evaluate.bm25, "index_dir": str(stage.dir / "index"), "_key": stage.key}

    # -- training ------------------------------------------------------------------------
    def train_files(self, row: RowSpec, seed: int) -> tuple[list[str], list]:
        """The row's training files and their identities: mined negatives when the row asks for them."""
        if (row.name, seed) not in self._train_files:
            self._train_files[row.name, seed] = self._mined_or_given(row, seed)
        return self._train_files[row.name, seed]

    def _mined_or_given(self, row: RowSpec, seed: int) -> tuple[list[str], list]:
        from taser.pipeline.mine import mine_negatives

        data, ev = self.data(), self.table.evaluate
        sources = [Path(self.table.data_of(row).data_dir) / f for f in row.train_files] if row.train_files else data["train_files"]
        if row.negatives == Negatives.given:
            return [str(p) for p in sources], [self.identity(p) for p in sources]
        files, ids = [], []
        for source in sources:
            mine = {"top_n": ev.mine_top_n, "negatives": ev.mine_negatives, "match": self.match()}
            distant = row.positives == Positives.distant
            if distant:
                mine["positives"] = "distant"  # keyed only when set: the stages mined with given positives keep their keys
            inputs = {"train": self.identity(source), "passages": data["ids"]["passages"]}
            if row.negatives == Negatives.bm25:
                bm25 = self.bm25()
                inputs["bm25"] = bm25["_key"]
                args = {"retriever": "bm25", "bm25": {k: v for k, v in bm25.items() if k != "_key"}}
            else:  # dense: mined from the `uses` row's retrieval of the training questions at this seed (a reader row on it shares it)
                uses = self.table.rows[row.uses]
                questions = self.training_questions(source, self.identity(source))
                retrieved = self.retrieve(uses, seed, f"retrieve training questions ({uses.name})", "retrieve-train",
                                          questions.dir / "questions.qa.tsv", questions.key, ev.mine_top_n)
                inputs["retrieval"] = retrieved.key
                args = {"retriever": "retrieval", "retrieval": str(retrieved.dir / "retrieval.json"), "retrieved_k": ev.mine_top_n}
            kind = "negatives-bm25" if row.negatives == Negatives.bm25 else "negatives-dense"
            stage = self.stage("negatives", kind, mine, inputs,
                              lambda d, s=source, a=args, distant=distant: mine_negatives(s, data["passages"], d / "train.json", top_n=ev.mine_top_n,
                                                                         num_hard_negatives=ev.mine_negatives, match=self.match(),
                                                                         progress=self.job.progress, distant_positives=distant, **a),
                              owner=row)
            files.append(str(stage.dir / "train.json"))
            ids.append(stage.key)
        return files, ids

    def training_questions(self, source: Path, source_id, first: int | None = None) -> Stage:
        """The questions (and answers) of a training file as a QA file, its first `first` (None: all),
        for a retriever to retrieve their passages: a reader's training passages, or dense mining's."""
        from itertools import islice

        from taser.data.biencoder_json import BiEncoderJsonFile
        from taser.data.qa import QAPair, write_qa

        def build(d: Path) -> None:
            records = islice(BiEncoderJsonFile(source, require_positive=False), first)
            write_qa(d / "questions.qa.tsv", (QAPair(r["question"], list(r["answers"])) for r in records))

        return self.stage("training questions", "train-questions", {"first": first}, {"train": source_id}, build)

    def model_settings(self, row: RowSpec) -> dict:
        return {**self.table.model, **row.model}

    def train_settings(self, row: RowSpec, seed: int) -> dict:
        return {**self.table.train, **row.train, "seed": seed, "name": row.name}

    def trained(self, row: RowSpec, seed: int) -> Stage:
        """The row's trained model at `seed` (resumed from its last checkpoint after a kill)."""
        from taser.pipeline.train import run_training

        files, ids = self.train_files(row, seed)
        model, train = self.model_settings(row), self.train_settings(row, seed)
        run = {**train, "resume": True, "progress": self.job.progress}
        processes = self.processes()
        canonical_model = model_key(model)
        key_settings = train_key(train, canonical_model, processes, threads=not self.store.planned)
        if row is not self.table.row(self.job.row) and self.job.processes is None and processes != self.table.processes:
            # another row's model (a hybrid's, dense negatives'), asked for on a smaller allocation than the table documents for
            # training: the one that row's own job trained on the documented allocation, when it is there
            documented = train_key(train, canonical_model, self.table.processes, threads=not self.store.planned)
            if self.store.done(stage_key("train", {"model": canonical_model, "train": documented}, {"train_files": ids})):
                log.info("row %s uses %s's model trained on %d processes (this job has %d)", self.job.row, row.name, self.table.processes, processes)
                key_settings, processes = documented, self.table.processes
        settings, inputs = {"model": canonical_model, "train": key_settings}, {"train_files": ids}
        own = row is self.table.row(self.job.row)
        planned_here = own or not self.job.scheduled
        if not self.store.planned and not self.store.done(stage_key("train", settings, inputs)):
            found = self._same_recipe_elsewhere(row, seed, settings, inputs, own)
            if found is not None:  # another row's model, trained by its own job on another machine kind
                log.info("row %s uses %s's model %s (trained as %s)", self.job.row, row.name, found["key"], machine_parts(found["settings"]["train"]))
                settings, processes = found["settings"], self.table.processes
        if planned_here and not isinstance(self.store, PrepareStore):  # a prepare job trains nothing: no recipe to warn about
            self._warn_if_other_batch(row, settings["train"]["global_batch"], processes)

        def build(d: Path) -> None:
            from taser.training.checkpoint import remove_checkpoint

            if not planned_here:  # the sweep planned this model in its own row's job
                raise StageNotPlanned(f"row {row.name}'s model at seed {seed} is not in the store {self.store.root}: its own job builds it, "
                                      f"and this job ({self.job.row}) was not planned to; rerun the sweep (a job whose stages are "
                                      "built is not submitted again)")
            if processes > 1:
                train_under_torchrun(model, files, run, d, processes)
            else:
                run_training(model, files, run, d)
            remove_checkpoint(d / "checkpoint")  # the resumable state: done with once final/ is written

        return self.stage(f"train {row.name}", "train", settings, inputs, build, owner=row)

    def _same_recipe_elsewhere(self, row: RowSpec, seed: int, settings: dict, inputs: dict, own: bool) -> dict | None:
        """The training stage of this recipe that another machine kind built (or started): `precision: auto`
        resolved otherwise (bf16 on an A100/H100, fp16 on a V100), or other CPU threads. For another row's
        model: the one such stage that is done, at the table's global batch (None if none); refused when
        several are. For the job's own row: refused when one exists, so that one recipe is never split
        across GPU generations."""
        from taser.training.config import TrainConfig

        auto = str(TrainConfig.from_value(self.train_settings(row, seed)).precision) == "auto"
        ours = training_recipe(settings, batch=own)
        same = found_elsewhere(self.store, "train", inputs, lambda theirs: training_recipe(theirs, batch=own) == ours, done_only=False)
        if not own:
            batch = self.table.global_batch(row)
            return at_most_one([r for r in same if r["done"] and r["settings"]["train"]["global_batch"] == batch],
                               f"row {row.name}'s model at seed {seed} was trained", lambda r: machine_parts(r["settings"]["train"]),
                               self.store, "table.train.precision")
        if auto and same:
            raise RecipeSplit(f"row {row.name} at seed {seed} would train as {machine_parts(settings['train'])} on this machine, and the store "
                              f"already holds this recipe as " + "; ".join(f"{r['key']} ({machine_parts(r['settings']['train'])}, "
                                                                          f"{'done' if r['done'] else 'started'})" for r in same)
                              + ": precision auto resolves per GPU generation. Run this job where that one ran, or pin "
                              "table.train.precision (its stages then have keys of their own)")
        return None

    def _warn_if_other_batch(self, row: RowSpec, global_batch: int, processes: int) -> None:
        expected = self.table.global_batch(row)
        if global_batch != expected and not self.store.planned:
            log.warning("table %s, row %s is documented for a global batch of %d questions (%d processes); this job trains on %d "
                        "process(es): %d questions per step, another recipe than the table's (its own stages)", self.table.name, row.name,
                        expected, self.table.processes, processes, global_batch)

    def processes(self) -> int:
        if self.job.processes is not None:
            return self.job.processes
        if self.store.planned:
            return self.table.processes
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() and torch.cuda.device_count() > 1 else 1

    def initial(self, row: RowSpec) -> Stage:
        from taser.pipeline.experiment import save_initial

        model = self.model_settings(row)
        return self.stage(f"initial {row.name}", "initial", {"model": model_key(model)}, {}, lambda d: save_initial(model, d), owner=row)

    def checkpoint(self, row: RowSpec, seed: int) -> tuple[Stage, str]:
        if row.kind == RowKind.zero_shot:
            stage = self.initial(row)
            return stage, str(stage.dir / "initial")
        stage = self.trained(row, seed)
        return stage, str(stage.dir / "final")

    def dense_index(self, row: RowSpec, seed: int) -> Stage:
        """The row's passages encoded (resumably) into a flat index."""
        from taser.models.backends import vectors_precision
        from taser.pipeline.evaluate import dense_index
        from taser.runtime import pick_device

        ev, data = self.table.evaluate, self.data()
        model, checkpoint = self.checkpoint(row, seed)
        settings = {"precision": vectors_precision("torch", ev.precision, pick_device(ev.device)), "backend": "torch"}
        inputs = {"checkpoint": model.key, "passages": data["ids"]["passages"]}
        own = row is self.table.row(self.job.row)
        if not own and not self.store.planned and not self.store.done(stage_key("dense-index", settings, inputs)):
            # another row's index, encoded by its own job in the precision its GPUs resolved: found whatever that was
            backend = settings["backend"]
            same = at_most_one(found_elsewhere(self.store, "dense-index", inputs, lambda theirs: theirs.get("backend") == backend),
                               f"row {row.name}'s index at seed {seed} was encoded", lambda r: r["settings"]["precision"], self.store,
                               "table.evaluate.precision")
            if same:
                log.info("row %s uses %s's index %s (encoded in %s)", self.job.row, row.name, same["key"], same["settings"]["precision"])
                settings = same["settings"]

        def build(d: Path) -> None:
            if not own and self.job.scheduled:  # the sweep planned this index in its own row's job
                raise StageNotPlanned(f"row {row.name}'s index at seed {seed} is not in the store {self.store.root}: its own job builds it, "
                                      f"and this job ({self.job.row}) was not planned to; rerun the sweep")
            dense_index(checkpoint, data["passages"], d, min(ev.batch_size, 64), ev.precision, ev.device, chunk_size=ev.chunk_size,
                        shards=self.processes())  # every GPU of the job

        return self.stage(f"index {row.name}", "dense-index", settings, inputs, build, owner=row)

    # -- evaluation ----------------------------------------------------------------------
    def evaluate(self, row: RowSpec, seed: int) -> Stage:
        """The row's retrieval of the evaluation questions (its results); a reader row's: its retriever's."""
        if row.kind == RowKind.reader:
            return self.evaluate(self.table.rows[row.uses], seed)
        ev, data = self.table.evaluate, self.data()
        return self.retrieve(row, seed, "evaluate", "evaluate", data["qa_file"], data["ids"]["qa"], ev.k)

    def retrieve(self, row: RowSpec, seed: int, label: str, kind: str, qa_file: Path, qa_id, k: int) -> Stage:
        """The row's retriever on the questions of `qa_file`: its top-k of each (retrieval.json), results.json and per_query.jsonl."""
        from taser.pipeline.evaluate import evaluate_bm25, evaluate_dense, evaluate_hybrid

        ev, data, dataset = self.table.evaluate, self.data(), self.table.data_of(row).dataset
        common = {"qa_file": qa_file, "passages_tsv": data["passages"], "k": k, "match": self.match(), "dataset": dataset, "name": row.name}
        settings = {"k": k, "match": self.match(), "dataset": dataset, "name": row.name, "kind": str(row.kind)}
        inputs = {"qa": qa_id, "passages": data["ids"]["passages"]}
        if row.kind == RowKind.bm25:
            bm25 = self.bm25()
            inputs["bm25"] = bm25.pop("_key")
            return self.stage(label, kind, settings, inputs, lambda d: evaluate_bm25(out_dir=d, bm25=bm25, **common))
        dense_row = self.table.rows[row.uses] if row.kind == RowKind.hybrid else row
        model, checkpoint = self.checkpoint(dense_row, seed)
        index = self.dense_index(dense_row, seed)
        inputs.update(checkpoint=model.key, index=index.key)
        dense = {"batch_size": ev.batch_size, "precision": ev.precision, "device": ev.device}
        if row.kind == RowKind.hybrid:
            bm25 = self.bm25()
            inputs["bm25"] = bm25.pop("_key")
            settings["candidates"] = row.candidates or ev.k
            return self.stage(label, kind, settings, inputs,
                             lambda d: evaluate_hybrid(checkpoint, index.dir / "index", out_dir=d, bm25=bm25, candidates=settings["candidates"],
                                                       **dense, **common))
        return self.stage(label, kind, settings, inputs, lambda d: evaluate_dense(checkpoint, index.dir / "index", out_dir=d, **dense, **common))


def train_under_torchrun(model: dict, files: list[str], train: dict, out: Path, processes: int) -> None:
    """The training stage on `processes` GPUs of this machine: torchrun, one rank each."""
    run_torchrun("taser.pipeline.train_worker", {"model": model, "train_files": files, "train": train, "output_dir": str(out)},
                 out / "torchrun-spec.json", processes, "training", f"the last checkpoint in {out}")


def row_stages(run: RowRun, row: RowSpec, seed: int) -> tuple[Stage, Stage | None]:
    """Every stage of `row` at `seed`, through `run`'s store: its retrieval of the evaluation questions
    (a reader row's: its retriever's), and its reading (a reader row's own reader, else the table's
    `read.reader` where it names one; None: no reading)."""
    from taser.pipeline.reader_stages import read_stage, trained_reader

    evaluated = run.evaluate(row, seed)
    if row.kind == RowKind.reader:
        return evaluated, read_stage(run, evaluated, trained_reader(run, row, seed), row.name)
    return evaluated, read_stage(run, evaluated) if run.table.read.reader else None


def _publish(stage_dir: Path, out: Path, reference: dict | None = None, row_seed: int | None = None, report_ks: list[int] | None = None) -> None:
    """A stage's results.json and per_query.jsonl copied into `out` (per_query first: results.json marks it whole)."""
    out.mkdir(parents=True, exist_ok=True)
    for name in (PER_QUERY_FILE, "retrieval.json", "predictions.json"):  # the passages and a reader's answers behind the figures (report.py inspect=...)
        if name == PER_QUERY_FILE or (stage_dir / name).is_file():
            with atomic_path(out / name) as tmp:  # a temporary name of its own: two writers never share one
                shutil.copyfile(stage_dir / name, tmp)
    results = json.loads((stage_dir / RESULTS_FILE).read_text())
    if reference is not None:
        results["reference"] = reference  # the paper's figures for this row, beside what it reached
    if report_ks is not None:
        results["report_ks"] = list(report_ks)  # the table's report columns (scripts/report.py's default)
    if row_seed is not None and results.get("seed") != row_seed:  # a reading of the row at this seed: its seeds group as the row's do
        results["reader_seed"], results["seed"] = results.get("seed"), row_seed
    with atomic_open(out / RESULTS_FILE) as f:
        json.dump(results, f, indent=2)


class SeveralTasks(RuntimeError):
    """A table job started as several SLURM tasks: each would run the whole row."""


def refuse_several_tasks(environ=None) -> None:
    """A table's job is one process: its training stage starts its own ranks (torchrun, `processes`).
    Started as several tasks of one SLURM step (submitit's tasks_per_node > 1, `srun -n N`), every
    task would run the whole row, and the one holding the training stage's lock would wait for
    ranks that wait for that lock: refused before anything starts."""
    import os

    from taser.training.distributed import slurm_step_tasks

    env = os.environ if environ is None else environ
    tasks = slurm_step_tasks(env)
    if tasks > 1 and "TORCHELASTIC_RUN_ID" not in env:
        raise SeveralTasks(f"this job runs as {tasks} SLURM tasks (task {env.get('SLURM_PROCID', '?')}), and every task would run the "
                           "whole row: run one task per job (hydra.launcher.tasks_per_node=1, as the slurm_* launcher presets do); the "
                           "training stage starts one rank per GPU itself (processes=N, default: every visible GPU)")


def stage_records(stages: list[tuple[str, Stage]]) -> list[dict]:
    return [{"stage": label, "key": s.key, "dir": str(s.dir), "built": s.built, "seconds": round(s.seconds, 3), "waited_s": round(s.waited, 3)}
            for label, s in stages]


def prepare_row(job: ExperimentJob, store: StageStore | None = None) -> dict:
    """phase=prepare: build only the row's CPU stages (CPU_KINDS), so the job that then runs the row on
    GPUs finds them; its record goes to `prepare.json` in the job's directory (no results)."""
    with _job_ledger(job) as ledger:
        record = _prepare_row(job, store)
        ledger.extend(s["key"] for s in record["stages"])
    return record


@contextlib.contextmanager
def _job_ledger(job: ExperimentJob):
    """The job's lock while it runs (a sweep's job only), its record when it ends (`taser.pipeline.job_ledger`)."""
    from taser.pipeline import job_ledger

    keys: list[str] = []
    with job_ledger.running(job) if job.scheduled else contextlib.nullcontext():
        yield keys
        job_ledger.record_finished(job, keys)


def _prepare_row(job: ExperimentJob, store: StageStore | None) -> dict:
    from taser.runtime import describe_hardware

    start = time.perf_counter()
    run = RowRun(job, store or PrepareStore(job.stages_dir, wait=not job.scheduled))
    run.evaluate(job.table.row(job.row), job.seed)
    stages = [(label, s) for label, s in run.stages if s.key.rsplit("-", 1)[0] in CPU_KINDS]
    record = {"table": job.table.name, "row": job.row, "seed": job.seed, "phase": str(job.phase), "commit": code_commit(),
              "machine": describe_hardware(), "allocation": allocation(), "seconds": time.perf_counter() - start, "stages": stage_records(stages)}
    out = Path(job.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with atomic_open(out / PREPARE_FILE) as f:
        json.dump(record, f, indent=2, default=str)
    log.info("%s / %s: prepared %d CPU stages (%s) in %.0f s", job.table.name, job.row, len(stages),
             ", ".join(label for label, _ in stages) or "none", record["seconds"])
    return record


def run_row(job: ExperimentJob, store: StageStore | None = None) -> dict:
    """Run (or find) every stage of `job.row` at `job.seed`; write the row's files into `job.out_dir`."""
    refuse_several_tasks()
    if job.phase == JobPhase.prepare:
        return prepare_row(job, store)
    with _job_ledger(job) as ledger:
        record = _run_row(job, store)
        ledger.extend(s["key"] for s in record["stages"])
    return record


def _run_row(job: ExperimentJob, store: StageStore | None) -> dict:
    from taser.runtime import describe_hardware

    start = time.perf_counter()
    table: TableSpec = job.table
    row = table.row(job.row)
    run = RowRun(job, store)
    evaluated, reading = row_stages(run, row, job.seed)
    out = Path(job.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    first_seed = min(table.seeds)
    writes_results = row.seeded or job.seed == first_seed
    record = {
        "table": table.name, "row": job.row, "name": row.name, "seed": job.seed if row.seeded else None, "dataset": table.data_of(row).dataset,
        "reference": row.reference, "reference_cites": row.cites, "reference_source": table.reference_source, "commit": code_commit(),
        "machine": describe_hardware(),
        "allocation": allocation(),
        "seconds": time.perf_counter() - start, "job": asdict(job),
        "stages": stage_records(run.stages),
    }  # fmt: skip
    if writes_results and row.kind == RowKind.reader:  # its results are the reader's (its retriever's row reports the retrieval)
        _publish(reading.dir, out / READER_DIR, row.reference, row_seed=job.seed, report_ks=table.report_ks)
    elif writes_results:
        _publish(evaluated.dir, out / RETRIEVAL_DIR, row.reference, report_ks=table.report_ks)
        if reading is not None:
            _publish(reading.dir, out / READER_DIR, row_seed=job.seed if row.seeded else None)
    else:
        record["results"] = f"a row without training reports once, with the table's first seed ({first_seed})"
    with atomic_open(out / EXPERIMENT_FILE) as f:
        json.dump(record, f, indent=2, default=str)
    built = [label for label, s in run.stages if s.built]
    log.info("%s / %s, seed %s: %d stages (%d built now: %s) in %.0f s -> %s", table.name, job.row, job.seed, len(run.stages), len(built),
             ", ".join(built) or "none", record["seconds"], out)
    return record
