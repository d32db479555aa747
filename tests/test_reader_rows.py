"""Issue 48: reader rows in a table (DPR's Table 4). A reader row trains a reader on its retriever
row's passages inside the table's stage store: the reading-comprehension stage once for every reader
row and seed whose settings match, the training questions' retrieval once per (retriever, seed),
the open-domain stage once per (reader row, seed), then the reading of the evaluation questions.
Tiny scale, in process: a tiny random BERT, four SQuAD articles, a few steps."""

import json
from pathlib import Path

import pytest
from test_experiment import job_of, squad4, tiny  # noqa: F401 - squad4 is a fixture


def _dotted(prefix: str, settings: dict) -> list[str]:
    return [f"++{prefix}.{key}={value}" for key, value in settings.items()]


READER = ["table.reader_training.max_length=64", "table.reader_training.max_question_length=24", "table.reader_training.retrieve_k=5",
          "table.reader_training.limit_train_questions=12",
          *_dotted("table.reader_training.reading", {"batch_size": 4, "passages": 1, "max_steps": 2, "warmup_steps": 0, "save_every": 1,
                                                     "precision": "fp32", "device": "cpu"}),
          *_dotted("table.reader_training.open_domain", {"batch_size": 2, "passages": 2, "top_n": 5, "max_steps": 4, "warmup_steps": 1,
                                                         "save_every": 1, "precision": "fp32", "device": "cpu"}),
          "table.read.precision=fp32", "table.read.device=cpu", "table.read.ks=[1,5]"]


def reader_job(squad, pretrained, stages, row, seed, out, extra=()):
    return job_of([*tiny(squad, pretrained, stages), f"table.reader_training.pretrained={pretrained}", *READER, f"row={row}", f"seed={seed}",
                   f"out_dir={out}", *extra])


def kinds_built(record) -> dict[str, int]:
    from collections import Counter

    return dict(Counter(s["key"].rsplit("-", 1)[0] for s in record["stages"] if s["built"]))


def test_reader_rows_share_the_reading_stage_and_train_one_reader_per_retriever_and_seed(squad4, tiny_pretrained, tmp_path):  # noqa: F811
    from taser.evaluation.runs import read_run
    from taser.pipeline.rows import READER_DIR, RETRIEVAL_DIR, run_row

    stages = tmp_path / "stages"
    records = {}
    for row, seed in [("reader-bm25", 1), ("reader-dpr", 1), ("reader-bm25", 2), ("reader-dpr", 2)]:
        records[row, seed] = run_row(reader_job(squad4, tiny_pretrained, stages, row, seed, tmp_path / row / f"seed-{seed}"))
    built = {key: kinds_built(r) for key, r in records.items()}
    assert built["reader-bm25", 1].get("reader-reading") == 1  # the first reader row builds the shared reading stage ...
    assert all("reader-reading" not in b for key, b in built.items() if key != ("reader-bm25", 1))  # ... every other finds it
    assert all(b.get("reader") == 1 and b.get("read") == 1 for b in built.values())  # one reader and one reading per (row, seed)
    assert built["reader-bm25", 1].get("train-questions") == 1 and sum(b.get("train-questions", 0) for b in built.values()) == 1
    # BM25 retrieves the training questions once (no seed); dpr at each seed, with its model of that seed (trained by the row here)
    assert built["reader-bm25", 1].get("retrieve-train") == 1 and "retrieve-train" not in built["reader-bm25", 2]
    assert built["reader-dpr", 1].get("retrieve-train") == 1 and built["reader-dpr", 2].get("retrieve-train") == 1
    assert built["reader-dpr", 1].get("train") == 1 and built["reader-dpr", 2].get("train") == 1
    readers = {key: next(s["key"] for s in r["stages"] if s["stage"].startswith("train reader")) for key, r in records.items()}
    assert len(set(readers.values())) == 4
    import torch

    for record in records.values():  # a run's reader keys hold this machine's training threads and resolved precision
        reader_dir = next(Path(s["dir"]) for s in record["stages"] if s["stage"].startswith("train reader"))
        train = json.loads((reader_dir / "stage.json").read_text())["settings"]["train"]
        assert (train["cpu_threads"], train["precision"], train["seed"]) == (torch.get_num_threads(), "fp32", record["seed"])

    for (row, seed), record in records.items():
        out = tmp_path / row / f"seed-{seed}"
        assert not (out / RETRIEVAL_DIR).exists()  # the retriever's own row reports the retrieval
        run = read_run(out / READER_DIR / "results.json")
        assert run.task == "reader" and run.seed == seed and run.system == ("reader on BM25" if row == "reader-bm25" else "reader on dpr")
        assert set(run.metrics) == {"EM@1", "EM@5", "F1@1", "F1@5"} and len(run.per_query) == 30
        assert len(json.loads((out / READER_DIR / "predictions.json").read_text())) == 30  # the answers, for the inspection page
        results = json.loads((out / READER_DIR / "results.json").read_text())
        assert results["report_ks"] == [1, 5, 20, 100] and results["reference"] == {}
        assert record["seed"] == seed

    again = run_row(reader_job(squad4, tiny_pretrained, stages, "reader-dpr", 2, tmp_path / "again"))
    assert [s["stage"] for s in again["stages"] if s["built"]] == []  # a second run builds nothing


def test_a_reader_stage_killed_mid_training_resumes_to_the_uninterrupted_reader(squad4, tiny_pretrained, tmp_path, monkeypatch, caplog):  # noqa: F811
    """The open-domain stage stopped after its second checkpoint (an exception where a kill would
    land: the lock is released, the checkpoint kept); the rerun resumes from it and reads with the
    weights, EM and predictions of a run never stopped."""
    import taser.reader.trainer as trainer
    from taser.pipeline.rows import READER_DIR, run_row

    clean = run_row(reader_job(squad4, tiny_pretrained, tmp_path / "clean", "reader-bm25", 1, tmp_path / "clean-out"))
    saved = trainer.save_checkpoint
    calls = {"n": 0}

    class Killed(Exception):
        pass

    def save_then_die(directory, *args, **kwargs):
        saved(directory, *args, **kwargs)
        if "reader-reading" not in str(directory):
            calls["n"] += 1
            if calls["n"] == 2:
                raise Killed(directory)

    monkeypatch.setattr(trainer, "save_checkpoint", save_then_die)
    stages = tmp_path / "stages"
    with pytest.raises(Killed) as killed:
        run_row(reader_job(squad4, tiny_pretrained, stages, "reader-bm25", 1, tmp_path / "out"))
    stage_dir = Path(str(killed.value)).parent
    assert (stage_dir / "checkpoint").is_dir() and not (stage_dir / "final").exists() and not list(stages.glob("*.lock"))
    monkeypatch.setattr(trainer, "save_checkpoint", saved)
    caplog.set_level("INFO", logger="taser.reader.trainer")
    resumed = run_row(reader_job(squad4, tiny_pretrained, stages, "reader-bm25", 1, tmp_path / "out"))
    assert [s["stage"] for s in resumed["stages"] if s["built"]] == ["train reader on BM25", "read"]
    assert f"resumed the reader from {stage_dir / 'checkpoint'} at step 2 of 4" in caplog.text  # not trained again from the start
    for name in ("results.json",):
        a = json.loads((tmp_path / "clean-out" / READER_DIR / name).read_text())
        b = json.loads((tmp_path / "out" / READER_DIR / name).read_text())
        assert (a["em"], a["f1"]) == (b["em"], b["f1"])
    keys = lambda r: [s["key"] for s in r["stages"]]  # noqa: E731
    assert keys(clean) == keys(resumed)
    from safetensors.torch import load_file

    clean_dir = next(Path(s["dir"]) for s in clean["stages"] if s["stage"] == "train reader on BM25")
    a, b = load_file(clean_dir / "final" / "model.safetensors"), load_file(stage_dir / "final" / "model.safetensors")
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)
    assert not (stage_dir / "checkpoint").exists()  # done with once final/ is written


def test_reader_stage_keys_follow_their_settings_and_not_where_or_how_loudly(squad4, tiny_pretrained, tmp_path):  # noqa: F811
    from taser.pipeline.rows import RowRun, row_stages
    from taser.pipeline.stages import PlannedStore

    def keys(row="reader-dpr", seed=1, extra=()):
        job = reader_job(squad4, tiny_pretrained, tmp_path / "stages", row, seed, tmp_path / "out", extra)
        run = RowRun(job, PlannedStore())
        row_stages(run, job.table.row(row), seed)
        return {label: stage.key for label, stage in run.stages}

    base = keys()
    assert {"reader: reading comprehension", "training questions", "retrieve training questions (dpr)", "train reader on dpr", "read"} <= set(base)
    loud = keys(extra=["table.reader_training.open_domain.log_every=1", "table.reader_training.open_domain.save_every=3",
                       "table.reader_training.open_domain.device=auto"])
    assert loud == base  # logging, checkpointing and the device leave the weights alone
    other_lr = keys(extra=["table.reader_training.open_domain.learning_rate=3e-5"])
    assert other_lr["train reader on dpr"] != base["train reader on dpr"] and other_lr["reader: reading comprehension"] == base["reader: reading comprehension"]
    other_reading = keys(extra=["table.reader_training.reading.max_steps=3"])
    assert other_reading["reader: reading comprehension"] != base["reader: reading comprehension"]
    assert other_reading["train reader on dpr"] != base["train reader on dpr"]  # a new first stage, a new second
    other_model = keys(extra=["table.reader_training.max_answer_length=5"])
    assert other_model["reader: reading comprehension"] != base["reader: reading comprehension"]
    seed2 = keys(seed=2)
    assert seed2["reader: reading comprehension"] == base["reader: reading comprehension"] and seed2["training questions"] == base["training questions"]
    assert seed2["train reader on dpr"] != base["train reader on dpr"]
    assert seed2["retrieve training questions (dpr)"] != base["retrieve training questions (dpr)"]
    bm25 = keys("reader-bm25")
    assert bm25["retrieve training questions (BM25)"] == keys("reader-bm25", seed=2)["retrieve training questions (BM25)"]
    no_reading = keys(extra=["table.reader_training.reading=null"])
    assert "reader: reading comprehension" not in no_reading and no_reading["train reader on dpr"] != base["train reader on dpr"]
    more = keys(extra=["table.reader_training.retrieve_k=7"])
    assert more["retrieve training questions (dpr)"] != base["retrieve training questions (dpr)"] and more["train reader on dpr"] != base["train reader on dpr"]
    fewer_articles = keys(extra=["table.data.train_articles=2"])  # other gold passages: every reader stage trains again
    assert fewer_articles["reader: reading comprehension"] != base["reader: reading comprehension"]
    assert fewer_articles["training questions"] != base["training questions"] and fewer_articles["train reader on dpr"] != base["train reader on dpr"]
    deeper = keys(extra=["table.evaluate.k=7"])  # the evaluation questions' retrieval changes, the reader does not: read again
    assert deeper["train reader on dpr"] == base["train reader on dpr"] and deeper["read"] != base["read"]


def test_reader_settings_are_checked_before_anything_runs(squad4, tiny_pretrained, tmp_path):  # noqa: F811
    with pytest.raises(ValueError, match=r"open_domain: seed is set by the table"):
        reader_job(squad4, tiny_pretrained, tmp_path, "reader-dpr", 1, tmp_path, ["++table.reader_training.open_domain.seed=3"])
    with pytest.raises(ValueError, match=r"reading: stage is set by the table"):
        reader_job(squad4, tiny_pretrained, tmp_path, "reader-dpr", 1, tmp_path, ["++table.reader_training.reading.stage=open_domain"])
    with pytest.raises(ValueError, match=r"table.reader_training.retrieve_k must be >= 1, got 0"):
        reader_job(squad4, tiny_pretrained, tmp_path, "reader-dpr", 1, tmp_path, ["table.reader_training.retrieve_k=0"])
    with pytest.raises(ValueError, match=r"table.reader_training.limit_train_questions must be >= 1 or null \(all\), got 0"):
        reader_job(squad4, tiny_pretrained, tmp_path, "reader-dpr", 1, tmp_path, ["table.reader_training.limit_train_questions=0"])
    with pytest.raises(ValueError, match=r"row reader on dpr: train.batch_size must be an integer >= 1"):
        reader_job(squad4, tiny_pretrained, tmp_path, "reader-dpr", 1, tmp_path, ["table.reader_training.open_domain.batch_size=0"])
    with pytest.raises(ValueError, match=r"a reader row's uses='reader-dpr' must name a retriever row"):
        reader_job(squad4, tiny_pretrained, tmp_path, "reader-bm25", 1, tmp_path, ["table.rows.reader-bm25.uses=reader-dpr"])


def test_dpr_table4_shares_the_stages_it_should_without_running_nq():
    """The preset's stage graph (planned, nothing built): per dataset, the three readers share its
    training questions; each reader row its retriever's stages; BM25's index serves every dataset."""
    from taser.sweeps.plan import compose_job, plan

    stages = plan(["dpr_table4"])
    by_kind: dict[str, list] = {}
    for stage in stages.values():
        by_kind.setdefault(stage.kind, []).append(stage)
    datasets = ("nq", "trivia", "webq", "trec", "squad")
    assert len(by_kind["bm25-index"]) == 1 and len(by_kind["bm25-index"][0].users) == 20  # bm25, hybrid and their readers, 5 datasets
    # 5 Single retrievers and the multi-set one (WQ's and TREC's Multi rows); 3 readers a dataset and the 2 Multi readers
    assert len(by_kind["train"]) == 6 and len(by_kind["reader"]) == 17 and len(by_kind["retrieve-train"]) == 17
    assert "reader-reading" not in by_kind  # DPR's recipe: the open-domain stage from BERT directly
    for stage in by_kind["train-questions"]:
        [dataset] = {row.split("-")[0] for _, row in stage.users if row.endswith("-reader-bm25")}
        multi = ["multi"] if dataset in ("webq", "trec") else []
        expected = [f"{dataset}-reader-{r}" for r in ("bm25", "dpr", "hybrid", *multi)]
        if dataset == "nq":  # the Multi readers start from NQ's reader on DPR: they build (or find) it on the way
            expected += ["trec-reader-multi", "webq-reader-multi"]
        assert sorted(row for _, row in stage.users) == sorted(expected)
    for dataset in datasets:
        [trained] = [s for s in by_kind["train"] if ("dpr_table4", f"{dataset}-dpr") in s.users]
        nq_reader_users = ["trec-reader-multi", "webq-reader-multi"] if dataset == "nq" else []  # NQ's reader needs NQ's DPR
        assert sorted(row for _, row in trained.users) == sorted([*(f"{dataset}-{r}" for r in ("dpr", "hybrid", "reader-dpr", "reader-hybrid")),
                                                                   *nq_reader_users])
        [evaluated] = [s for s in by_kind["evaluate"] if (("dpr_table4", f"{dataset}-bm25") in s.users)]
        assert sorted(row for _, row in evaluated.users) == [f"{dataset}-bm25", f"{dataset}-reader-bm25"]
    from taser.pipeline.rows import RowRun
    from taser.pipeline.stages import PlannedStore

    job = compose_job("dpr_table4", "trec-reader-dpr")
    table = job.table
    assert RowRun(job, PlannedStore()).match() == "regex"  # CuratedTREC's answers are patterns
    assert RowRun(compose_job("dpr_table4", "nq-reader-dpr"), PlannedStore()).match() == "string"
    assert table.data_of(table.row("trec-reader-dpr")).match == "regex" and table.data_of(table.row("nq-reader-dpr")).match is None
    assert table.rows["nq-reader-dpr"].reference == {"EM@50": 41.5, "EM@10": 40.8}  # read from 50 passages (and 10), the paper's k
    assert {key: row.reference.get("EM") for key, row in table.rows.items() if row.kind == "reader" and "EM" in row.reference} == {
        "nq-reader-bm25": 32.6, "trivia-reader-bm25": 52.4, "trivia-reader-dpr": 56.8, "webq-reader-bm25": 29.9,
        "webq-reader-dpr": 34.6, "trec-reader-bm25": 24.9, "trec-reader-dpr": 25.9, "squad-reader-dpr": 29.8, "webq-reader-multi": 42.4,
        "trec-reader-multi": 49.4}
    assert table.reader_training.reading is None and table.reader_training.open_domain["passages"] == 24


def test_the_report_sets_a_reader_rows_em_beside_the_papers(tmp_path):
    from taser.evaluation.difference_tables import reference_table
    from taser.evaluation.runs import RunResult

    runs = []
    for seed, em in ((1, 40.0), (2, 42.0)):
        run = RunResult("reader on DPR", "NQ", "reader", None)
        run.seed, run.reference = seed, {"EM": 41.5, "EM@10": 40.8}
        run.metrics = {"EM@1": 30.0, "EM@10": em - 1, "EM@100": em, "F1@100": em + 8}
        runs.append(run)
    text = reference_table(runs)
    assert "| reader on DPR | NQ | EM (largest k read: 100) | 41.5 | 41.0 (2 run(s)) | -0.5 |" in text
    assert "| reader on DPR | NQ | EM@10 | 40.8 | 40.0 (2 run(s)) | -0.8 |" in text


def test_a_sweep_of_reader_rows_trains_the_shared_reading_stage_in_one_job_before_the_others():
    """The documented command's sweep in waves: reader jobs hold training allocations (the train
    class); the reading stage has one builder, in an earlier wave than every other reader job; a
    reader on dpr runs after dpr's own job at its seed."""
    from taser.sweeps.check import sweep_jobs
    from taser.sweeps.schedule import schedule

    plan = schedule(sweep_jobs(["table=squad_cpu", "row=dpr,reader-bm25,reader-dpr", "seed=1,2"], "experiment"))
    jobs = {(j.job.row, j.job.seed): j for j in plan.jobs if not j.prepare}
    assert {j.klass for (row, _), j in jobs.items() if row.startswith("reader-")} == {"train"}
    [reading] = {key for j in plan.jobs for key, kind in j.stages if kind == "reader-reading"}
    builder = plan.jobs[plan.builders[reading]]
    assert builder.job.row.startswith("reader-")
    assert all(j.wave > builder.wave for (row, _), j in jobs.items() if row.startswith("reader-") and j is not builder)
    assert all(jobs["reader-dpr", seed].wave > jobs["dpr", seed].wave for seed in (1, 2))


def test_a_smoke_run_shrinks_the_readers_training_too():
    from taser.sweeps.plan import compose_job

    table = compose_job("dpr_table4", "nq-reader-dpr", ("smoke_steps=2",)).table
    assert table.reader_training.open_domain["max_steps"] == 2 and table.reader_training.limit_train_questions == 100
    squad = compose_job("squad_cpu", "reader-dpr", ("smoke_steps=3",)).table
    assert squad.reader_training.reading["max_steps"] == 3 and squad.reader_training.open_domain["max_steps"] == 3


def _reader_run(root: Path, system: str, seed: int, correct: list[bool]) -> None:
    """A reader row's published files: results.json, per_query.jsonl and predictions.json."""
    out = root / system.replace(" ", "-") / f"seed-{seed}" / "reader"
    out.mkdir(parents=True)
    em = 100.0 * sum(correct) / len(correct)
    (out / "results.json").write_text(json.dumps({"task": "reader", "name": system, "dataset": "SQuAD", "seed": seed, "ks": [1], "em": {"1": em},
                                                  "f1": {"1": em}, "top_k": {"1": 50.0}, "per_query_file": "per_query.jsonl"}))
    (out / "per_query.jsonl").write_text("".join(json.dumps({"id": str(i), "rank": 1, "EM@1": 100.0 * c, "F1@1": 100.0 * c}) + "\n"
                                                 for i, c in enumerate(correct)))
    predictions = [{"question": f"who wrote book {i}?", "answers": [f"author {i}"], "prediction": f"author {i}" if c else f"{system} guess {i}",
                    "by_k": {"1": {"prediction": f"author {i}" if c else f"{system} guess {i}"}}} for i, c in enumerate(correct)]
    (out / "predictions.json").write_text(json.dumps(predictions))


def test_the_inspection_page_of_two_readers_shows_each_ones_answer_beside_the_gold_answers(tmp_path):
    from taser.evaluation.comparison import StatsSettings
    from taser.evaluation.report import read_runs, write_report

    for seed in (1, 2):
        _reader_run(tmp_path / "runs", "reader on BM25", seed, [True, False, False, True, False, True])
        _reader_run(tmp_path / "runs", "reader on dpr", seed, [True, True, seed == 1, True, False, True])
    report = write_report(read_runs([tmp_path / "runs"]), tmp_path / "report", ks=(1,), stats=StatsSettings(baseline="reader on BM25", resamples=99),
                          inspect=["reader on dpr"], inspect_k=1)
    [page] = (tmp_path / "report").glob("inspect-*.html")
    assert page.name == "inspect-reader-on-dpr-vs-reader-on-bm25-squad-em1.html"
    text = page.read_text()
    assert "reader on dpr against reader on BM25 on SQuAD, EM@1" in text and "Questions that flipped at EM@1 (<span id=shown>2</span>" in text
    assert "who wrote book 1?" in text and "who wrote book 2?" in text and "who wrote book 0?" not in text  # only the flipped ones
    assert "<b>Predicted answer</b> (first seed): reader on dpr: <q>author 1</q>; reader on BM25: <q>reader on BM25 guess 1</q>" in text
    assert "<b>Answers:</b> author 1" in text and "Texts missing" not in text
    assert "reader on dpr: answered exactly (share of seeds)" in text
    assert "It is the family of report.md beside this page" in text
    assert "inspect-reader-on-dpr-vs-reader-on-bm25-squad-em1.html" in report["markdown"]


def test_a_reader_key_holds_the_precision_auto_resolves_to_and_the_cpu_threads():
    """Two machines that resolve `auto` differently train different weights: their keys differ, as a retriever's do."""
    import torch

    from taser.pipeline.stage_settings import reader_train_key
    from taser.runtime import resolve_precision

    key = reader_train_key({"precision": "auto", "device": "cpu", "max_steps": 5})
    assert key["precision"] == resolve_precision("auto", "cpu") != "auto"
    assert key["cpu_threads"] == torch.get_num_threads() and "epochs" not in key and "device" not in key
    assert "cpu_threads" not in reader_train_key({"device": "cpu"}, threads=False) and "epochs" in reader_train_key({"device": "cpu"})
    assert reader_train_key({"device": "cpu", "eval_every": 5, "val_passages": 3}) == reader_train_key({"device": "cpu"})  # only best/ differs
    assert reader_train_key({"device": "cpu", "name": "DPR reader", "max_nonfinite_losses": 9}) == reader_train_key({"device": "cpu", "name": "x"})


def test_every_reader_setting_that_changes_the_weights_changes_the_reader_key():
    """Would catch a setting that changes what the reader learns (its steps, warmup, passages per
    question, rates, seed, stage...) left out of the stage key: two recipes would share one reader."""
    from dataclasses import fields

    from taser.pipeline.stage_settings import NOT_IN_READER_KEY, reader_train_key
    from taser.reader.config import ReaderTrainConfig

    base = {"device": "cpu", "max_steps": 10, "precision": "fp32"}
    other = {"stage": "reading", "precision": "bf16", "max_steps": 11, "head_learning_rate": 3e-5, "epochs": 2}
    checked = []
    for f in fields(ReaderTrainConfig):
        if f.name in NOT_IN_READER_KEY:
            continue
        default = base.get(f.name, f.default)
        value = other.get(f.name, default * 2 + 1 if isinstance(default, int) and not isinstance(default, bool) else
                          (default * 3 or 0.01) if isinstance(default, float) else not default if isinstance(default, bool) else None)
        assert value is not None, f"no other value of {f.name} to try: add one to `other`"
        settings = {**base, f.name: value} if f.name != "epochs" else {**base, "max_steps": None, "epochs": value}
        reference = base if f.name != "epochs" else {**base, "max_steps": None}
        assert reader_train_key(settings, threads=False) != reader_train_key(reference, threads=False), f.name
        checked.append(f.name)
    assert {"batch_size", "passages", "top_n", "max_answers", "stage", "learning_rate", "warmup_steps", "max_steps", "seed", "grad_clip"} <= set(checked)


def test_dense_mining_shares_the_training_questions_retrieval_with_the_reader_on_the_same_retriever():
    """squad_cpu's `dpr, 1 dense-mined negative` mines from dpr's retrieval of the training questions at
    its seed, the stage the reader on dpr trains from: one retrieval for both (planned, nothing built)."""
    from taser.sweeps.plan import plan

    stages = plan(["squad_cpu"])
    [shared] = [s for s in stages.values() if s.kind == "retrieve-train" and ("squad_cpu", "dpr-dense-neg") in s.users]
    assert sorted(row for _, row in shared.users) == ["dpr-dense-neg", "reader-dpr"]
    [mined] = [s for s in stages.values() if s.kind == "negatives-dense"]
    assert mined.users == [("squad_cpu", "dpr-dense-neg")]
    [questions] = [s for s in stages.values() if s.kind == "train-questions"]
    assert ("squad_cpu", "dpr-dense-neg") in questions.users and ("squad_cpu", "reader-bm25") in questions.users


def test_a_reader_row_names_the_table_and_row_when_its_data_has_several_training_files():
    from types import SimpleNamespace

    from taser.pipeline.reader_stages import reader_gold

    def run_with(files):
        return SimpleNamespace(data=lambda: {"train_files": files}, table=SimpleNamespace(name="t4"), job=SimpleNamespace(row="reader-dpr"),
                               identity=lambda path: f"id:{path}")

    assert reader_gold(run_with(["q.json"])) == (Path("q.json"), "id:q.json")
    for files in (["a.json", "b.json"], []):
        expected = rf"table t4, row reader-dpr: a reader trains on one training file of questions; the table's data has {len(files)}"
        with pytest.raises(ValueError, match=expected):
            reader_gold(run_with(files))


def test_the_open_domain_stage_starts_from_the_reading_stages_reader(squad4, tiny_pretrained, tmp_path, monkeypatch):  # noqa: F811
    from taser.pipeline import reader as pipeline_reader
    from taser.pipeline.rows import run_row

    loaded, original = [], pipeline_reader.Reader.load
    monkeypatch.setattr(pipeline_reader.Reader, "load", lambda path, *a, **k: loaded.append(str(path)) or original(path, *a, **k))
    record = run_row(reader_job(squad4, tiny_pretrained, tmp_path / "stages", "reader-bm25", 1, tmp_path / "out"))
    reading, trained = (next(Path(s["dir"]) for s in record["stages"] if s["stage"] == name)
                        for name in ("reader: reading comprehension", "train reader on BM25"))
    assert loaded[0] == str(reading / "final")  # the first reader loaded: the open-domain stage's start
    assert str(trained / "final") in loaded[1:]  # then the reading of the evaluation questions


def test_a_reader_row_reads_with_its_own_reader_where_the_table_also_names_one(squad4, tiny_pretrained, tmp_path, monkeypatch):  # noqa: F811
    """Would catch a reader row reading its retriever's passages with the table's `read.reader` (the
    checkpoint the retriever rows are read with) instead of the reader the row trained."""
    import taser.pipeline.reader as reader_module
    from taser.pipeline.reader_stages import read_stage
    from taser.pipeline.rows import RowRun
    from taser.pipeline.stages import Stage

    checkpoints = []
    monkeypatch.setattr(reader_module, "read", lambda job: checkpoints.append(job.checkpoint))
    shared = tmp_path / "shared-reader"
    shared.mkdir()
    (shared / "model.safetensors").write_bytes(b"not read here")
    job = reader_job(squad4, tiny_pretrained, tmp_path / "stages", "reader-dpr", 1, tmp_path / "out", [f"table.read.reader={shared}"])
    trained, evaluated = Stage("reader-0123", tmp_path / "trained", True, 0.0), Stage("evaluate-0123", tmp_path / "evaluated", True, 0.0)
    read_stage(RowRun(job), evaluated, trained, "reader on dpr")
    read_stage(RowRun(job), Stage("evaluate-4567", tmp_path / "evaluated-bm25", True, 0.0))  # a retriever row: the table's reader
    assert checkpoints == [str(tmp_path / "trained" / "final"), str(shared)]


# reader-dpr made to fine-tune reader-bm25's reader, for 2 steps of its own (a table's rows are typed: overrides change existing ones)
FINE_TUNED = ["++table.rows.reader-dpr.reader_from=reader-bm25", "++table.rows.reader-dpr.reader.max_steps=2"]


def test_a_reader_row_fine_tunes_another_rows_reader_of_the_same_seed(squad4, tiny_pretrained, tmp_path):  # noqa: F811
    """DPR Table 4's Multi rows: a reader row starts from the reader another reader row trained (at
    the same seed), not from the reading stage; the source row's job then finds that reader built."""
    from taser.pipeline.rows import READER_DIR, run_row

    stages = tmp_path / "stages"
    record = run_row(reader_job(squad4, tiny_pretrained, stages, "reader-dpr", 1, tmp_path / "ft", FINE_TUNED))
    by_label = {s["stage"]: s for s in record["stages"]}
    source, own = by_label["train reader on BM25"], by_label["train reader on dpr"]
    assert source["built"] and own["built"]
    spec = json.loads((Path(own["dir"]) / "stage.json").read_text())
    assert spec["inputs"]["init"] == source["key"] and spec["settings"]["train"]["max_steps"] == 2  # the row's own reader settings
    assert json.loads((Path(source["dir"]) / "stage.json").read_text())["settings"]["train"]["max_steps"] == 4
    assert (tmp_path / "ft" / READER_DIR / "results.json").is_file()
    bm25 = run_row(reader_job(squad4, tiny_pretrained, stages, "reader-bm25", 1, tmp_path / "bm25", FINE_TUNED))
    assert not next(s for s in bm25["stages"] if s["stage"] == "train reader on BM25")["built"]  # found: trained once for both rows


def test_reader_from_and_row_reader_settings_are_checked(squad4, tiny_pretrained, tmp_path):  # noqa: F811
    base = [*tiny(squad4, tiny_pretrained, tmp_path), "row=reader-bm25"]
    with pytest.raises(ValueError, match="reader_from='dpr' must name another reader row of the table"):
        job_of([*base, "++table.rows.reader-dpr.reader_from=dpr"])
    with pytest.raises(ValueError, match=r"reader_from goes round in a circle \(reader-bm25 -> reader-dpr -> reader-bm25\)"):
        job_of([*base, "++table.rows.reader-bm25.reader_from=reader-dpr", "++table.rows.reader-dpr.reader_from=reader-bm25"])
    with pytest.raises(ValueError, match="reader and reader_from are settings of reader rows"):
        job_of([*base, "++table.rows.dpr.reader_from=reader-bm25"])
    with pytest.raises(ValueError, match="row reader on BM25: .*batch_szie"):
        job_of([*base, "++table.rows.reader-bm25.reader.batch_szie=2"])
