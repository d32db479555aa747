"""A table's sweep in waves, so that no job waits on another job's stage while it holds an allocation.

Every job of the sweep is planned (`RowRun` over a `PlannedStore`: its stages' keys, nothing built).
Each stage is then given one builder job, and a job that needs a stage another job builds runs in a
later wave than that job. The sweeper (`hydra_plugins.taser_table_sweeper`) launches one wave at a
time: a job waits for its inputs in the sweep's driver, not in a SLURM allocation.

- The stages that never use a GPU (`CPU_KINDS`: data, BM25's index, BM25-mined negatives) are built
  by *prepare* jobs (the row's job with `phase=prepare`), added to the sweep where some job needs
  such a stage; with BM25 rows they form the `cpu` class, which SLURM launchers run without GPUs.
- A trained row's stages (its training, its index, its dense-mined negatives) are built by that
  row's own job at that seed; a row that uses them (a hybrid, dense negatives) runs a wave later.
- Jobs that build a training stage (a retriever's or a reader's) form the `train` class (the sweep's launcher as given); the
  others that need a GPU (zero-shot, hybrid, a seed of a row whose model another job trains) form
  the `evaluate` class (smaller SLURM allocations: `hydra.sweeper.launchers.evaluate`).

Stages are planned with files named rather than hashed: two differently named files with one
content are one stage to the store but two to the plan (their jobs would then share a lock).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from taser.pipeline.stages import CPU_KINDS

CLASSES = ("cpu", "train", "evaluate")  # launched in this order within a wave
TRAINING_KINDS = frozenset({"train", "reader-reading", "reader"})  # a job that builds one of these is of the train class


@dataclass
class PlannedJob:
    overrides: list[str]
    job: object  # the typed ExperimentJob
    stages: list[tuple[str, str]]  # (key, kind), in the order the job asks for them
    owners: dict[str, str]  # stage key -> the row whose own stage it is
    prepare: bool = False
    klass: str = ""
    needs: set[int] = field(default_factory=set)  # indices (into Schedule.jobs) of the jobs it runs after
    wave: int = 0

    @property
    def name(self) -> str:
        return f"{'prepare ' if self.prepare else ''}{self.job.row} seed {self.job.seed}"


@dataclass
class Schedule:
    jobs: list[PlannedJob]
    builders: dict[str, int]  # stage key -> the index of the job that builds it

    def waves(self) -> list[dict[str, list[int]]]:
        """[{class: [job indices]}] in launch order."""
        out: list[dict[str, list[int]]] = [{} for _ in range(1 + max((j.wave for j in self.jobs), default=0))]
        for i, job in enumerate(self.jobs):
            out[job.wave].setdefault(job.klass, []).append(i)
        return [{k: wave[k] for k in CLASSES if k in wave} for wave in out]

    def describe(self) -> str:
        lines = []
        for number, wave in enumerate(self.waves()):
            for klass, indices in wave.items():
                for i in indices:
                    job = self.jobs[i]
                    after = ", ".join(self.jobs[n].name for n in sorted(job.needs)) or "nothing"
                    lines.append(f"wave {number} [{klass}] {job.name}: builds {sum(1 for b in self.builders.values() if b == i)} stage(s), after {after}")
        return "\n".join(lines)

    def record(self) -> dict:
        return {
            "waves": [{klass: [" ".join(self.jobs[i].overrides) for i in ids] for klass, ids in wave.items()} for wave in self.waves()],
            "jobs": [
                {
                    "overrides": j.overrides,
                    "class": j.klass,
                    "wave": j.wave,
                    "after": [" ".join(self.jobs[n].overrides) for n in sorted(j.needs)],
                    "builds": sorted(k for k, b in self.builders.items() if b == i),
                }
                for i, j in enumerate(self.jobs)
            ],
        }


def plan_job(job) -> tuple[list[tuple[str, str]], dict[str, str]]:
    """The stages `job` asks for (key, kind) and each one's owner row, without building anything."""
    from taser.pipeline.rows import RowRun, row_stages
    from taser.pipeline.stages import PlannedStore

    run = RowRun(job, PlannedStore(job.stages_dir))
    row_stages(run, job.table.row(job.row), job.seed)
    return [(stage.key, run.store.kinds[stage.key]) for _, stage in run.stages], run.owners


def prepare_overrides(overrides: list[str], row: str) -> list[str]:
    """A prepare job's overrides: its row's, in a directory of its own (no results there)."""
    return [*overrides, "phase=prepare", f"hydra.sweep.subdir=prepare/{row}"]


def _as_prepare(job):
    """The typed config of a row's prepare job (what the job itself composes from `phase=prepare`)."""
    import copy

    from taser.pipeline.table import JobPhase

    prepare = copy.copy(job)
    prepare.phase = JobPhase.prepare
    return prepare


def schedule(jobs: list[tuple[list[str], object]]) -> Schedule:
    """The waves of a sweep's jobs: [(overrides, typed ExperimentJob)] in the sweep's order."""
    from taser.pipeline.table import RowKind

    planned = []
    for overrides, job in jobs:
        stages, owners = plan_job(job)
        planned.append(PlannedJob(list(overrides), job, stages, owners))
    cpu_rows = [p for p in planned if p.job.table.row(p.job.row).kind == RowKind.bm25]
    covered: set[str] = set()
    prepares = []
    gpu_jobs = [p for p in planned if p not in cpu_rows]
    for p in sorted(gpu_jobs, key=lambda p: -sum(kind in CPU_KINDS for _, kind in p.stages)):  # the widest first: fewer prepare jobs
        cpu = [(key, kind) for key, kind in p.stages if kind in CPU_KINDS]
        if any(key not in covered for key, _ in cpu):
            prepares.append(PlannedJob(prepare_overrides(p.overrides, p.job.row), _as_prepare(p.job), cpu, {}, prepare=True, klass="cpu"))
            covered.update(key for key, _ in cpu)
    ordered = prepares + planned  # prepare jobs first: they build the CPU stages the others share
    for p in cpu_rows:
        p.klass = "cpu"

    builders: dict[str, int] = {}
    for key in dict.fromkeys(key for p in ordered for key, _ in p.stages):
        users = [i for i, p in enumerate(ordered) if any(k == key for k, _ in p.stages)]
        kind = next(kind for k, kind in ordered[users[0]].stages if k == key)
        if kind in CPU_KINDS:
            cpu_users = [i for i in users if ordered[i].klass == "cpu"]
            builders[key] = (cpu_users or users)[0]
        else:
            owners = [i for i in users if ordered[i].owners.get(key) == ordered[i].job.row]
            builders[key] = (owners or users)[0]
    for i, p in enumerate(ordered):
        p.needs = {builders[key] for key, _ in p.stages if builders[key] != i}
        if not p.klass:
            builds_training = any(builders[key] == i and kind in TRAINING_KINDS for key, kind in p.stages)
            p.klass = "train" if builds_training else "evaluate"
    _assign_waves(ordered)
    return Schedule(ordered, builders)


def _assign_waves(jobs: list[PlannedJob]) -> None:
    """Each job one wave after the latest of the jobs it needs (longest path); a cycle is refused."""
    state: dict[int, int] = {}  # 1: being visited, 2: done

    def visit(i: int) -> int:
        if state.get(i) == 2:
            return jobs[i].wave
        if state.get(i) == 1:
            raise ValueError(f"the sweep's jobs need each other's stages in a cycle (at {jobs[i].name}): they cannot be ordered")
        state[i] = 1
        jobs[i].wave = 1 + max((visit(n) for n in jobs[i].needs), default=-1)
        state[i] = 2
        return jobs[i].wave

    for i in range(len(jobs)):
        visit(i)
