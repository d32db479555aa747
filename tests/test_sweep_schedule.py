"""A table's sweep in waves (taser.sweeps.schedule, the table sweeper): no job waits for a stage that
another job builds, CPU work runs in CPU jobs, and a failed job stops only the jobs that need it."""

import json
import runpy
import sys

import pytest
from conftest import ROOT
from test_experiment import squad4, tiny  # noqa: F401 - squad4 is a fixture

from taser.pipeline.stages import CPU_KINDS
from taser.sweeps.check import sweep_jobs
from taser.sweeps.schedule import schedule


@pytest.fixture(scope="module")
def schedules():
    import logging

    logging.disable(logging.WARNING)
    try:
        return {table: schedule(sweep_jobs([f"table={table}"], "experiment")) for table in ("squad_cpu", "dpr_nq")}
    finally:
        logging.disable(logging.NOTSET)


@pytest.fixture(params=["squad_cpu", "dpr_nq"])
def table_schedule(request, schedules):
    return request.param, schedules[request.param]


def test_every_stage_has_one_builder_that_runs_in_an_earlier_wave_than_its_other_users(table_schedule):
    _, plan = table_schedule
    every = {key for job in plan.jobs for key, _ in job.stages}
    assert set(plan.builders) == every
    for i, job in enumerate(plan.jobs):
        for key, _ in job.stages:
            builder = plan.builders[key]
            assert builder == i or plan.jobs[builder].wave < job.wave, (job.name, key, plan.jobs[builder].name)
        assert job.needs == {plan.builders[key] for key, _ in job.stages} - {i}


def test_cpu_stages_are_built_by_cpu_jobs_and_bm25_rows_hold_no_gpu(table_schedule):
    table, plan = table_schedule
    for key, builder in plan.builders.items():
        kind = key.rsplit("-", 1)[0]
        assert (plan.jobs[builder].klass == "cpu") == (kind in CPU_KINDS or plan.jobs[builder].job.row == "bm25"), (key, plan.jobs[builder].name)
    rows = {(j.job.row, j.job.seed): j for j in plan.jobs if not j.prepare}
    assert {j.klass for (row, _), j in rows.items() if row == "bm25"} == {"cpu"}
    assert all(j.klass == "train" for (row, _), j in rows.items() if row == "dpr")
    assert {j.klass for (row, _), j in rows.items() if row == "hybrid"} == {"evaluate"}  # it trains nothing: a smaller allocation
    prepares = [j for j in plan.jobs if j.prepare]
    assert len(prepares) == 1 and prepares[0].wave == 0 and "phase=prepare" in prepares[0].overrides
    assert all(kind in CPU_KINDS for _, kind in prepares[0].stages)


def test_a_row_that_uses_another_rows_model_runs_after_that_rows_job_at_its_seed(table_schedule):
    _, plan = table_schedule
    jobs = {(j.job.row, j.job.seed): j for j in plan.jobs if not j.prepare}
    for (row, seed), job in jobs.items():
        uses = job.job.table.rows[row].uses
        if uses:
            assert jobs[(uses, seed)].wave < job.wave
            # besides the row it uses: the builder of a retrieval of the training questions it shares with another row on the same
            # retriever (a reader row and a dense-mined row on dpr), which runs in an earlier wave too
            shared = {plan.jobs[plan.builders[key]].job.row for key, kind in job.stages if kind == "retrieve-train"}
            needed = {plan.jobs[n].job.row for n in job.needs if not plan.jobs[n].prepare}
            assert uses in needed and needed <= {uses} | shared and all(plan.jobs[n].wave < job.wave for n in job.needs)


def test_the_waves_of_dpr_nq(schedules):
    plan = schedules["dpr_nq"]
    names = [{klass: sorted(plan.jobs[i].name for i in ids) for klass, ids in wave.items()} for wave in plan.waves()]
    assert names[0] == {"cpu": ["prepare hybrid seed 1"], "train": [f"{row} seed {s}" for row in ("dpr", "dpr-multi") for s in (1, 2, 3)]}
    assert names[1] == {"cpu": ["bm25 seed 1"], "evaluate": ["hybrid seed 1", "hybrid seed 2", "hybrid seed 3"]}
    assert names[2] == {"cpu": ["bm25 seed 2", "bm25 seed 3"]}  # they find seed 1's stages: a row without training reports once


@pytest.mark.slow
@pytest.mark.isolated  # make test runs it in a pytest process of its own: after other tests on an xdist worker, its output capture was found closed
def test_a_failed_job_stops_only_the_jobs_that_need_its_stages(squad4, tiny_pretrained, tmp_path, monkeypatch, capsys):  # noqa: F811
    """dpr at seed 1 fails: the hybrid at seed 1 (which needs dpr's model) is not started; seed 2's
    jobs and the BM25 row run; the sweep then fails naming both."""
    import taser.pipeline.rows as rows

    started = []

    def fake_run_row(job, store=None):
        started.append((str(job.phase), job.row, job.seed))
        if (str(job.phase), job.row, job.seed) == ("row", "dpr", 1):
            raise RuntimeError("out of memory (on purpose)")
        return {}

    monkeypatch.setattr(rows, "run_row", fake_run_row)
    sweep = tmp_path / "sweep"
    monkeypatch.setattr(
        sys, "argv", ["experiment.py", "-m", *tiny(squad4, tiny_pretrained, tmp_path / "stages"), "row=dpr,hybrid,bm25", "seed=1,2", f"hydra.sweep.dir={sweep}"]
    )
    with pytest.raises(SystemExit):
        runpy.run_path(str(ROOT / "scripts" / "experiment.py"), run_name="__main__")
    assert started[0] == ("prepare", "dpr", 1)  # the CPU stages first
    assert sorted(started[1:]) == [("row", "bm25", 1), ("row", "bm25", 2), ("row", "dpr", 1), ("row", "dpr", 2), ("row", "hybrid", 2)]
    err = capsys.readouterr().err
    assert "2 of the sweep's 7 jobs failed or were not started: dpr seed 1, hybrid seed 1" in err
    assert "- dpr seed 1: RuntimeError: out of memory (on purpose)" in err  # each failure's reason, in the error itself
    record = json.loads((sweep / "schedule.json").read_text())
    assert [sorted(wave) for wave in record["waves"]] == [["cpu"], ["cpu", "train"], ["cpu", "evaluate"]]


def test_a_rows_own_job_builds_its_model_whatever_the_sweeps_order():
    """`row=hybrid,dpr`: the hybrid comes first in the sweep, yet dpr's job trains dpr (class train)
    and the hybrid (class evaluate) runs after it."""
    import logging

    logging.disable(logging.WARNING)
    try:
        plan = schedule(sweep_jobs(["table=dpr_nq", "row=hybrid,dpr", "seed=1"], "experiment"))
    finally:
        logging.disable(logging.NOTSET)
    jobs = {j.job.row: j for j in plan.jobs if not j.prepare}
    train = next(key for key, kind in jobs["dpr"].stages if kind == "train")
    assert plan.jobs[plan.builders[train]] is jobs["dpr"]
    assert (jobs["dpr"].klass, jobs["hybrid"].klass) == ("train", "evaluate") and jobs["dpr"].wave < jobs["hybrid"].wave


def test_a_prepare_store_builds_the_cpu_stages_only(tmp_path):
    from taser.pipeline.stages import PrepareStore

    store, built = PrepareStore(tmp_path), []
    for kind in ("squad", "bm25-index", "negatives-bm25", "train", "dense-index", "evaluate"):
        stage = store.run(kind, {"x": 1}, {}, lambda d, k=kind: built.append(k))
        assert stage.built == (kind in CPU_KINDS) and store.done(stage.key) == (kind in CPU_KINDS)
    assert built == ["squad", "bm25-index", "negatives-bm25"]


def test_a_job_phase_that_does_not_exist_is_refused_naming_the_choices(squad4, tiny_pretrained, tmp_path):  # noqa: F811
    from test_experiment import job_of

    from taser.pipeline.table import ExperimentJob

    table = job_of([*tiny(squad4, tiny_pretrained, tmp_path), "row=dpr"]).table
    with pytest.raises(ValueError, match="phase.*(row|prepare)"):  # built in Python, not through Hydra's schema
        ExperimentJob(table=table, row="dpr", phase="prepared")
    assert ExperimentJob(table=table, row="dpr", phase="prepare").phase.value == "prepare"


def test_the_driver_keys_each_job_as_the_job_keys_itself(table_schedule):
    """A rerun skips a job whose ledger says it finished: the driver must key a prepare job as the prepare
    job (phase=prepare) its overrides compose to, not as the row's job (it was resubmitted while the row ran)."""
    from taser.pipeline.job_ledger import job_key
    from taser.sweeps.check import sweep_jobs

    table, plan = table_schedule
    prepares = [job for job in plan.jobs if job.prepare]
    assert prepares
    for job in prepares[:1] + [j for j in plan.jobs if not j.prepare][:1]:
        [(_, composed)] = sweep_jobs([f"table={table}", *[o for o in job.overrides if not o.startswith("hydra.")]], "experiment")
        assert str(composed.phase) == str(job.job.phase) and job_key(composed) == job_key(job.job), job.name
