"""Stage keys that mean what they say: a changed input always rebuilds (data by content, the code by
recipe version), an unchanged recipe is always shared (canonical settings: dpr_nq's, taser_nq's and
dpr_table3's DPR are one training), and a sweep is checked whole before its first job."""

import ast
import json
import logging
import os
import re
import time
from pathlib import Path

import pytest
from conftest import ROOT
from test_experiment import job_of, run_script, squad4, tiny  # noqa: F401 - squad4 is a fixture

from taser.pipeline import file_hashes, stage_code
from taser.pipeline.rows import RowRun
from taser.pipeline.stage_settings import model_key, train_key
from taser.pipeline.stages import DONE_FILE, PlannedStore, StageStore, stage_key
from taser.sweeps.plan import END, START, generated_section, sharing_markdown


@pytest.fixture
def hash_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(file_hashes.CACHE_ENV, str(tmp_path / "hash-cache"))
    monkeypatch.setattr(file_hashes, "_memo", {})
    return tmp_path / "hash-cache"


# -- data by content ----------------------------------------------------------------------------
def test_a_file_changed_only_in_its_middle_rebuilds_its_stages(squad4, tiny_pretrained, tmp_path, hash_cache):  # noqa: F811
    """The old identity read the first and last MiB only: a passage changed in the middle kept its stages."""
    data = tmp_path / "squad.json"
    text = squad4.read_text()
    pad = " " * (3 << 20)  # JSON whitespace: the change below is in neither the first nor the last MiB
    data.write_text(pad + text + pad)
    overrides = tiny(data, tiny_pretrained, tmp_path / "stages") + ["row=bm25"]

    def data_stage():
        run = RowRun(job_of(overrides))
        run.data()
        return run.stages[0][1]

    first = data_stage()
    assert first.built and not data_stage().built  # the same file: found
    word = next(w for w in json.loads(text)["data"][1]["paragraphs"][0]["context"].split() if w.isalpha() and len(w) > 4)
    changed = text.replace(f" {word} ", f" {'x' * len(word)} ", 1)
    assert len(changed) == len(text) and changed != text
    data.write_text(pad + changed + pad)  # same size, same first and last MiB
    again = data_stage()
    assert again.built and again.key != first.key


def test_a_files_digest_is_computed_once_per_machine_and_again_when_the_file_changes(tmp_path, hash_cache, monkeypatch):
    path = tmp_path / "train.json"
    path.write_bytes(b"a" * 1000)
    identity = file_hashes.file_identity(path)
    assert identity == {"size": 1000, "sha256": __import__("hashlib").sha256(b"a" * 1000).hexdigest()}
    assert len(list(hash_cache.glob("*.json"))) == 1
    monkeypatch.setattr(file_hashes, "_memo", {})  # another process on this machine: the cache, not the bytes
    monkeypatch.setattr(file_hashes, "_sha256", lambda p: pytest.fail("hashed again although cached"))
    assert file_hashes.file_identity(path) == identity
    monkeypatch.undo()
    monkeypatch.setenv(file_hashes.CACHE_ENV, str(hash_cache))
    path.write_bytes(b"b" * 1000)  # same size, new content and mtime
    os.utime(path, ns=(time.time_ns() + 10**9, time.time_ns() + 10**9))
    assert file_hashes.file_identity(path)["sha256"] == __import__("hashlib").sha256(b"b" * 1000).hexdigest()


def _rewrite_in_place_keeping_mtime(path, content: bytes) -> None:
    """What `cp -p` onto an existing file or `rsync -a --inplace` do: same inode, same size, the source's mtime."""
    stamp = path.stat().st_mtime_ns
    with open(path, "r+b") as f:
        f.write(content)
    os.utime(path, ns=(stamp, stamp))


def test_a_same_size_rewrite_whose_mtime_is_restored_gets_a_new_digest(tmp_path, hash_cache, monkeypatch):
    import hashlib

    path = tmp_path / "nq-train.json"
    path.write_bytes(b"shakespeare" * 100)
    stamp = 1_700_000_000_000_000_000
    os.utime(path, ns=(stamp, stamp))
    first = file_hashes.file_identity(path)
    inode = path.stat().st_ino
    time.sleep(0.01)  # a later ctime on file systems with coarse timestamps
    _rewrite_in_place_keeping_mtime(path, b"marlowe!!!!" * 100)
    assert path.stat().st_ino == inode and path.stat().st_mtime_ns == stamp
    monkeypatch.setattr(file_hashes, "_memo", {})  # a new job: only the on-disk cache
    assert file_hashes.file_identity(path)["sha256"] == hashlib.sha256(b"marlowe!!!!" * 100).hexdigest() != first["sha256"]


def test_the_hash_cache_is_found_from_a_node_that_numbers_the_mount_otherwise(tmp_path, hash_cache, monkeypatch):
    """A shared home read from another client: the same file under another st_dev must hit the cache."""
    path = tmp_path / "passages.tsv"
    path.write_bytes(b"x" * 100)
    identity = file_hashes.file_identity(path)
    real_stat = os.stat

    def other_device(target, *args, **kwargs):
        st = real_stat(target, *args, **kwargs)
        if str(target) != str(path):
            return st
        fields = list(st[:10])
        fields[2] += 7  # st_dev
        return os.stat_result(fields, {"st_atime_ns": st.st_atime_ns, "st_mtime_ns": st.st_mtime_ns, "st_ctime_ns": st.st_ctime_ns})

    monkeypatch.setattr(os, "stat", other_device)
    assert path.stat().st_dev == real_stat(path).st_dev + 7
    monkeypatch.setattr(file_hashes, "_memo", {})
    monkeypatch.setattr(file_hashes, "_sha256", lambda p: pytest.fail("hashed again on a node whose mount has another number"))
    assert file_hashes.file_identity(path) == identity


def test_the_arrow_copy_and_the_offsets_cache_follow_a_rewrite_whose_mtime_is_restored(tmp_path):
    from taser.data.arrow_training import arrow_cache_path
    from taser.data.passage_store import PassageStore

    data = tmp_path / "train.json"
    data.write_text("[]" + " " * 50)
    before = arrow_cache_path(data)
    time.sleep(0.01)
    _rewrite_in_place_keeping_mtime(data, b"[ ]")
    assert arrow_cache_path(data) != before
    tsv = tmp_path / "passages.tsv"
    tsv.write_text("id\ttext\ttitle\n1\tfirst text\tA\n2\tsecond\tB\n")
    cache = tmp_path / "offsets.npz"
    assert PassageStore(tsv, cache=cache)["2"].text == "second"
    time.sleep(0.01)
    _rewrite_in_place_keeping_mtime(tsv, b"id\ttext\ttitle\n1\tfirst\tA\n2\tsecond text\tB\n")  # same size, row 2 moved
    assert PassageStore(tsv, cache=cache)["2"].text == "second text"


def test_a_file_written_while_it_is_hashed_is_refused_and_not_cached(tmp_path, hash_cache, monkeypatch):
    path = tmp_path / "passages.tsv"
    path.write_bytes(b"x" * 100)
    real = file_hashes._sha256

    def grows(p):
        digest = real(p)
        with open(p, "ab") as f:
            f.write(b"more")
        return digest

    monkeypatch.setattr(file_hashes, "_sha256", grows)
    with pytest.raises(RuntimeError, match="changed while it was being hashed"):
        file_hashes.file_identity(path)
    assert not list(hash_cache.glob("*.json"))


# -- the code, by recipe version ----------------------------------------------------------------
@pytest.mark.skipif(stage_code.python_minor() != stage_code.recorded()["python"],
                    reason=f"stage code recorded under Python {stage_code.recorded()['python']}; syntax trees print differently under others")
def test_every_stage_kinds_code_is_recorded_with_its_version():
    """Fails when the code that builds a kind of stage changed without `python -m taser.pipeline.stage_code bump|keep KIND`."""
    changed = stage_code.changed()
    assert not changed, (f"the code of stage kind(s) {changed} changed since their recipe version was recorded: run "
                         f"`python -m taser.pipeline.stage_code bump {' '.join(changed)}` if the change can alter what they build, "
                         f"`... keep {' '.join(changed)}` if it cannot")


def test_a_module_a_stage_runs_by_name_is_in_its_code():
    """The dense index of a several-GPU job is encoded by `python -m taser.pipeline.encode_worker` under
    torchrun: started by name, not imported, it must still be in the kind's code (and any such module)."""
    assert "taser.pipeline.encode_worker" in stage_code.modules("dense-index")
    assert "taser.pipeline.train_worker" in stage_code.modules("train")
    for kind, (roots, alone) in stage_code.CODE.items():
        hashed = set(stage_code.modules(kind))
        for module in hashed - (set(alone) - set(roots)):
            for node in ast.walk(stage_code._tree(module)):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and re.fullmatch(r"taser(\.\w+)+", node.value) \
                        and stage_code._module_exists(node.value):
                    assert node.value in hashed, f"{kind}: {module} names {node.value}, outside the kind's code"


def test_a_change_to_a_stages_code_is_seen_and_a_comment_is_not(monkeypatch):
    before = {kind: stage_code.code_hash(kind) for kind in ("train", "bm25-index")}
    real = stage_code._tree

    def edited(module, comment_only):
        tree = real(module)
        if module != "taser.training.loss":
            return tree
        source = ast.unparse(tree)
        return ast.parse(source + ("\n# a comment\n" if comment_only else "\nSCALE = 2.0\n"))

    monkeypatch.setattr(stage_code, "_tree", lambda module: edited(module, True))
    assert stage_code.code_hash("train") == before["train"]
    monkeypatch.setattr(stage_code, "_tree", lambda module: edited(module, False))
    assert stage_code.code_hash("train") != before["train"]  # the loss is part of training's code
    assert stage_code.code_hash("bm25-index") == before["bm25-index"]  # and not of BM25's


def test_the_recipe_version_is_in_the_key_and_an_unknown_kind_is_refused(monkeypatch):
    key = stage_key("train", {"a": 1}, {})
    table = stage_code.recorded()
    table["stages"]["train"]["version"] += 1
    monkeypatch.setattr(stage_code, "recorded", lambda: table)
    assert stage_key("train", {"a": 1}, {}) != key
    with pytest.raises(KeyError, match="no recorded version"):
        stage_key("trian", {"a": 1}, {})


def test_stage_json_records_the_version_and_the_commit(tmp_path):
    stage = StageStore(tmp_path).run("squad", {"a": 1}, {}, lambda d: None)
    record = json.loads((stage.dir / DONE_FILE).read_text())
    assert record["version"] == stage_code.version("squad") and record["commit"]  # this checkout is a git repository


def test_stage_code_cli_bumps_and_keeps(tmp_path, monkeypatch, capsys):
    table = tmp_path / "stage_code.json"
    table.write_text(stage_code.TABLE.read_text())
    monkeypatch.setattr(stage_code, "TABLE", table)
    version = stage_code.version("read")
    assert stage_code.main(["keep", "read"]) == 0 and stage_code.version("read") == version
    assert stage_code.main(["bump", "read"]) == 0 and stage_code.version("read") == version + 1
    assert stage_code.main(["bump", "nope"]) == 2 and "unknown" in capsys.readouterr().err


# -- canonical settings -------------------------------------------------------------------------
def planned_training(table: str, row: str, *overrides: str) -> tuple[str, dict]:
    job = job_of([f"table={table}", f"row={row}", *overrides])
    store = recording_store()
    stage = RowRun(job, store).trained(job.table.rows[row], 1)
    return stage.key, store.settings["train"]


def recording_store() -> PlannedStore:
    """A planned store that also keeps the settings each kind of stage was keyed with."""

    class Recording(PlannedStore):
        def __init__(self):
            super().__init__()
            self.settings = {}

        def run(self, kind, settings, inputs, build):
            self.settings.setdefault(kind, settings)
            return super().run(kind, settings, inputs, build)

    return Recording()


def test_one_recipe_trains_once_across_dpr_nq_taser_nq_and_table_3():
    """dpr_nq/dpr and taser_nq/dpr differed by an explicit `model_type: dpr`; Table 3's batch-128 row
    by 128 questions in one process where DPR's NQ set-up has 16 on each of 8 GPUs."""
    nq, settings = planned_training("dpr_nq", "dpr")
    assert planned_training("taser_nq", "dpr")[0] == nq
    assert planned_training("dpr_table3", "bm25-1-b128")[0] == nq
    assert settings["train"]["global_batch"] == 128 and settings["model"]["model_type"] == "dpr"
    assert planned_training("dpr_nq", "dpr", "processes=1")[0] != nq  # 16 questions per step: another recipe
    assert planned_training("taser_nq", "taser-t2")[0] != nq
    assert planned_training("dpr_table3", "bm25-1-b32")[0] != nq


def test_explicit_defaults_and_resolved_auto_values_key_as_what_they_are(tiny_pretrained):
    from taser.models.pretrained import SHIPPED_MODEL

    assert model_key({"pretrained": tiny_pretrained}) == model_key({"pretrained": tiny_pretrained, "model_type": "dpr", "pooling": "cls",
                                                                  "normalize": False, "similarity": "dot", "max_length": 256})
    shipped = model_key({})
    assert shipped == model_key({"pretrained": SHIPPED_MODEL, "pooling": "mean", "normalize": True})  # MiniLM's own
    assert shipped["pooling"] == "mean" and shipped["normalize"] is True and shipped["dropout"] == pytest.approx(0.1)
    assert model_key({"pooling": "cls"}) != shipped
    assert "taser" not in model_key({}) and model_key({"model_type": "taser"})["taser"]["specialize_every"] == 2
    model = model_key({"pretrained": tiny_pretrained})
    base = train_key({"max_steps": 10, "batch_size": 4}, model, 1)
    same = train_key({"max_steps": 10, "batch_size": 4, "epochs": 7, "compile_cache_dir": "/x", "grad_cache_chunk": 2, "save_every": 3,
                      "max_nonfinite_losses": 9, "name": "other"}, model, 1)
    assert same == base
    assert train_key({"max_steps": 10, "batch_size": 2, "grad_accumulation": 2}, model, 1) == base  # the same global batch
    assert train_key({"max_steps": 10, "batch_size": 2}, model, 2)["global_batch"] == 4
    for different in ({"max_steps": 11}, {"batch_size": 8}, {"learning_rate": 1e-4}, {"layer_decay": 0.8}, {"compile": True}):
        assert train_key({"max_steps": 10, "batch_size": 4, **different}, model, 1) != base, different
    assert train_key({"epochs": 2}, model, 1)["epochs"] == 2  # without max_steps the epochs decide the length


def test_the_cpu_thread_count_is_keyed_where_it_changes_the_bits(tiny_pretrained, monkeypatch):
    """local_parallel's one thread per worker does not compute the basic launcher's weights."""
    import torch

    model = model_key({"pretrained": tiny_pretrained})
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    two = train_key({"device": "cpu"}, model, 1)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    one = train_key({"device": "cpu"}, model, 1)
    assert one != two and one["cpu_threads"] == 1
    assert "cpu_threads" not in train_key({"device": "cpu"}, model, 1, threads=False)


def test_the_hybrid_fuses_the_depth_its_row_names():
    job = job_of(["table=dpr_nq", "row=hybrid"])
    store = recording_store()
    RowRun(job, store).evaluate(job.table.rows["hybrid"], 1)
    assert store.settings["evaluate"]["candidates"] == 2000
    with pytest.raises(ValueError, match="candidates"):
        job_of(["table=dpr_nq", "row=dpr", "+table.rows.dpr.candidates=50"])


# -- the sweep, checked whole -------------------------------------------------------------------
@pytest.mark.parametrize("launcher", ["basic", "joblib", "submitit_local"])
def test_a_typo_in_one_row_of_a_sweep_is_refused_before_any_job_starts(launcher, tmp_path):
    sweep = tmp_path / "sweep"
    start = time.perf_counter()
    done = run_script(["-m", "table=squad_cpu", "row=dpr,nope", "seed=1,2", f"hydra/launcher={launcher}", f"hydra.sweep.dir={sweep}",
                       f"stages_dir={tmp_path / 'stages'}"])
    assert done.returncode == 2, done.stderr[-2000:]
    assert "2 of the sweep's 4 jobs would fail, so none was started" in done.stderr and "unknown row 'nope'" in done.stderr
    assert not sweep.exists() and not (tmp_path / "stages").exists()  # no job ran, not even dpr's
    assert time.perf_counter() - start < 120


def test_a_bad_row_setting_in_a_sweep_names_the_row():
    from taser.sweeps.check import SweepRefused, check_sweep

    assert check_sweep(["-m", "table=squad_cpu"]) == 45  # 15 rows x 3 seeds, all fine
    assert check_sweep(["table=squad_cpu", "row=dpr"]) == 0  # not a sweep: the job checks itself
    with pytest.raises(SweepRefused, match=r"row dpr: unknown train settings \['batchsize'\]"):
        check_sweep(["-m", "table=squad_cpu", "row=dpr,shared", "+table.rows.dpr.train.batchsize=3"])


# -- the table's own settings -------------------------------------------------------------------
def test_a_smoke_run_is_one_setting_for_every_table(tmp_path):
    for table in ("squad_cpu", "dpr_nq", "dpr_table3", "taser_nq", "dpr_trivia"):
        job = job_of([f"table={table}", "smoke_steps=2"] + (["row=dpr"] if table != "dpr_table3" else ["row=inbatch-b8"]))
        assert job.table.train["max_steps"] == 2 and job.table.data.limit_questions == 100 and job.table.data.limit_passages == 20_000
        assert job.table.time_estimate and job.table.processes >= 1
    store = PlannedStore()
    run = RowRun(job_of(["table=dpr_nq", "row=dpr", "smoke_steps=2"]), store)
    run.data()
    assert [store.kinds[s.key] for _, s in run.stages] == ["qa-subset", "passages-subset"]
    # the SQuAD protocol's corpus (2,141 passages) is below the passage cap: its smoke run takes the first 8 articles, 6 training
    squad = job_of(["table=squad_cpu", "row=dpr", "smoke_steps=2"]).table.data
    assert (squad.articles, squad.train_articles) == (8, 6)
    class Recording(PlannedStore):
        def run(self, kind, settings, inputs, build):
            self.__dict__.setdefault("settings", {})[stage_key(kind, settings, inputs)] = settings
            return super().run(kind, settings, inputs, build)

    full, smoke = Recording(), Recording()
    RowRun(job_of(["table=squad_cpu", "row=dpr"]), full).data()
    RowRun(job_of(["table=squad_cpu", "row=dpr", "smoke_steps=2"]), smoke).data()
    whole = next(k for k, kind in full.kinds.items() if kind == "squad")
    assert full.settings[whole] == {"train_articles": 30}  # the whole corpus keeps its key: `articles` is keyed only when set
    subset = next(k for k, kind in smoke.kinds.items() if kind == "squad")
    assert smoke.settings[subset] == {"train_articles": 6, "articles": 8} and subset != whole
    built = RowRun(job_of(["table=squad_cpu", "row=dpr", "smoke_steps=2"]), StageStore(tmp_path / "stages")).data()
    passages = Path(built["passages"]).read_text(encoding="utf-8").splitlines()
    assert len(passages) == 1 + 486  # the header and the first 8 articles' passages (make quickstart's corpus), not all 2,141
    assert [line.rsplit("\t", 1)[-1] for line in (passages[1], passages[-1])] == ["Super Bowl 50", "Southern California"]
    with pytest.raises(ValueError, match=r"train_articles \(30\) must leave evaluation articles among the first 8"):
        job_of(["table=squad_cpu", "row=dpr", "table.data.articles=8"])  # no question would be left to evaluate


def test_the_report_takes_the_tables_columns_and_marks_rows_without_figures(tmp_path):
    from taser.evaluation.difference_tables import reference_table
    from taser.evaluation.runs import read_runs, report_ks

    for name, reference in (("BM25", {"top20": 59.1}), ("hybrid", {})):
        out = tmp_path / name
        out.mkdir()
        (out / "results.json").write_text(json.dumps({"name": name, "dataset": "NQ", "top_k": {"1": 40.0, "20": 60.0}, "reference": reference,
                                                      "report_ks": [1, 5, 20, 100]}))
    runs = read_runs([str(tmp_path)])
    assert report_ks(runs) == [1, 5, 20, 100]
    table = reference_table(runs)
    assert "| hybrid | NQ | – | not reported |" in table and "| BM25 | NQ | top-20 | 59.1 |" in table
    from taser.evaluation.report import write_report
    from taser.pipeline.jobs import ReportJob

    assert ReportJob(runs=[str(tmp_path)]).ks is None  # the script's default: the table's columns
    markdown = write_report(runs, tmp_path / "report", None, ["nDCG@10"], "t", None)["markdown"]
    assert "top-1" in markdown and "top-5" in markdown


def test_a_jobs_log_file_keeps_the_scripts_lines(tmp_path):
    from taser.cli import setup_logging

    root = logging.getLogger()
    handler = logging.FileHandler(tmp_path / "experiment.log")  # as Hydra attaches it
    root.addHandler(handler)
    try:
        setup_logging()
        logging.getLogger("taser.pipeline.rows").info("stage x: building")
        handler.flush()
        assert "stage x: building" in (tmp_path / "experiment.log").read_text()
    finally:
        root.removeHandler(handler)
        handler.close()


@pytest.mark.slow
def test_the_stage_sharing_table_in_the_docs_is_current():
    docs = ROOT / "docs" / "tables.md"
    assert START in docs.read_text() and END in docs.read_text()
    assert generated_section(docs) == sharing_markdown().strip(), "run: python -m taser.sweeps.plan --write docs/tables.md"



def test_a_rows_training_files_are_identified_once_per_run(squad4, tiny_pretrained, tmp_path, hash_cache, monkeypatch):  # noqa: F811
    import taser.pipeline.rows as rows

    calls = []
    monkeypatch.setattr(rows, "file_identity", lambda path: calls.append(Path(path).name) or file_hashes.file_identity(path))
    job = job_of(tiny(squad4, tiny_pretrained, tmp_path / "stages") + ["row=dpr", "table.rows.dpr.negatives=given"])
    run = RowRun(job)
    first = run.train_files(job.table.rows["dpr"], 1)
    assert run.train_files(job.table.rows["dpr"], 1) == first and calls.count("train.json") == 1


def test_a_job_on_another_allocation_than_the_tables_says_so(tmp_path, caplog):
    """dpr_nq is DPR's 16 questions per GPU on 8 GPUs: on one process it is another recipe (its own key), and a warning says so."""
    from taser.pipeline.stages import Stage

    class KeysOnly(StageStore):  # a real store's view (not a plan) that builds nothing
        def run(self, kind, settings, inputs, build):
            return Stage(stage_key(kind, settings, inputs), tmp_path, False, 0.0)

    # Table 3's batch-128 row sets its own batch on one process: as documented, no warning
    for table, row, processes, warned in (("dpr_nq", "dpr", "1", True), ("dpr_nq", "dpr", "8", False), ("dpr_table3", "bm25-1-b128", "1", False)):
        caplog.clear()
        job = job_of([f"table={table}", f"row={row}", f"processes={processes}"])
        run = RowRun(job, KeysOnly(tmp_path))
        run.train_files = lambda row, seed: ([], ["train-key"])
        with caplog.at_level(logging.WARNING, logger="taser.pipeline.rows"):
            run.trained(job.table.rows[row], 1)
        assert ("documented for a global batch of" in caplog.text) == warned, (table, row, caplog.text)


# -- issue 46: keys and identities that must change -----------------------------------------------
def test_rows_that_differ_only_in_their_model_train_apart():
    """Would catch a training key without the model settings (or with the table's instead of the
    row's): taser_nq's dpr and shared rows, and its TASER T=2 and T=3, differ only in the model, and
    a DPR row given TASER's training settings is still not TASER's model."""
    dpr, dpr_settings = planned_training("taser_nq", "dpr")
    shared, shared_settings = planned_training("taser_nq", "shared")
    assert shared != dpr and shared_settings["train"] == dpr_settings["train"]  # the same recipe, another model
    t2, t2_settings = planned_training("taser_nq", "taser-t2")
    t3, t3_settings = planned_training("taser_nq", "taser-t3")
    assert t2 != t3 and t2_settings["train"] == t3_settings["train"]
    like_taser, like_taser_settings = planned_training("taser_nq", "dpr", "+table.rows.dpr.train.layer_decay=0.8")
    assert like_taser_settings["train"] == t2_settings["train"] and like_taser != t2
    assert dpr_settings["model"]["model_type"] == "dpr" and t2_settings["model"]["model_type"] == "taser"
    assert t2_settings["model"]["taser"]["specialize_every"] == 2 and t3_settings["model"]["taser"]["specialize_every"] == 3


def test_the_reading_stage_is_keyed_by_the_readers_precision(tmp_path):
    """Would catch a read stage keyed without its precision: an fp32 reading and a bf16 one of the
    same retrieval are two readings, not one found by the other."""
    from taser.pipeline.reader_stages import read_stage
    from taser.pipeline.stages import Stage

    def read_key(precision: str) -> tuple[str, dict]:
        job = job_of(["table=squad_cpu", "row=dpr", f"table.read.reader={tmp_path / 'reader'}", f"table.read.precision={precision}",
                      "table.read.device=cpu"])
        store = recording_store()
        stage = read_stage(RowRun(job, store), Stage("evaluate-0123456789abcdef", tmp_path / "evaluated", False, 0.0))
        return stage.key, store.settings["read"]

    fp32, fp32_settings = read_key("fp32")
    bf16, bf16_settings = read_key("bf16")
    assert fp32 != bf16
    assert fp32_settings["precision"] == "fp32" and bf16_settings["precision"] == "bf16"
    assert read_key("fp32")[0] == fp32  # and the same precision is one reading


def test_a_file_changed_only_at_its_end_has_another_identity(tmp_path, hash_cache):
    """Would catch an identity of the first MiB, or of the first read block (16 MiB), only: the last
    byte of a 17 MiB file changed, its size kept, is another file."""
    import hashlib

    path = tmp_path / "passages.tsv"
    content = b"p\ttext\ttitle\n" * ((17 << 20) // 13)
    path.write_bytes(content)
    first = file_hashes.file_identity(path)
    assert first == {"size": len(content), "sha256": hashlib.sha256(content).hexdigest()}
    changed = content[:-2] + b"X\n"
    path.write_bytes(changed)
    os.utime(path, ns=(time.time_ns() + 10**9, time.time_ns() + 10**9))  # a new mtime even on a coarse clock
    again = file_hashes.file_identity(path)
    assert again["size"] == first["size"] and again["sha256"] != first["sha256"]
    assert again["sha256"] == hashlib.sha256(changed).hexdigest()


def test_one_offsets_cache_per_passages_file_is_built_once_and_shared(tmp_path, monkeypatch):
    """Every encoding rank, and every evaluation, mining and reader stage after it, scanned the 13 GB
    passages file again: now the first process to need it builds the shared cache while the others wait."""
    import threading

    from taser.data import passage_store
    from taser.data.passage_store import PassageStore

    monkeypatch.setenv("TASER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(passage_store, "OFFSETS_MIN_BYTES", 0)
    tsv = tmp_path / "psgs.tsv"
    tsv.write_text("id\ttext\ttitle\n" + "".join(f"{i}\tpassage {i}\tT{i}\n" for i in range(1, 200)))
    builds, real_build = [], PassageStore._build
    monkeypatch.setattr(PassageStore, "_build", lambda self: (builds.append(1), time.sleep(0.2), real_build(self)))
    barrier, texts = threading.Barrier(4), []

    def rank():
        barrier.wait()
        with PassageStore(tsv) as store:
            texts.append(store["17"].text)

    ranks = [threading.Thread(target=rank) for _ in range(4)]
    for t in ranks:
        t.start()
    for t in ranks:
        t.join()
    assert texts == ["passage 17"] * 4 and len(builds) == 1
    assert [p.name.split(".")[0] for p in (tmp_path / "cache" / "passage-offsets").glob("*.npz")] == ["psgs"]
    next((tmp_path / "cache" / "passage-offsets").glob("*.npz")).write_bytes(b"")  # a cache cut short: rebuilt, not trusted
    assert PassageStore(tsv)["17"].text == "passage 17" and len(builds) == 2
    monkeypatch.setattr(passage_store, "OFFSETS_MIN_BYTES", 1 << 40)  # a small file: scanned, no cache written
    PassageStore(tsv)
    assert len(builds) == 3 and len(list((tmp_path / "cache" / "passage-offsets").glob("*.npz"))) == 1
