"""One training recipe, one model, whatever GPU generation a job lands on: `precision: auto` resolves
per node (bf16 on an A100/H100, fp16 on a V100), and that part of a key must neither make a job of
another row train the model again nor split one row's training across two keys."""

import json

import pytest
import torch

import taser.pipeline.train as train_module
import taser.runtime as runtime
from taser.pipeline.machine_kinds import RecipeSplit, StageNotPlanned
from taser.pipeline.rows import RowRun
from taser.pipeline.stages import DONE_FILE, StageStore, stage_key
from taser.pipeline.table import ExperimentJob


def _machine(monkeypatch, gpus: int, bf16: bool) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setattr(runtime, "cuda_has_bf16", lambda: gpus > 0 and bf16)


class MarkDone(StageStore):
    """A job's store whose training stages are marked done as if trained (nothing runs)."""

    def run(self, kind, settings, inputs, build):
        if kind == "train":
            d = self.dir(stage_key(kind, settings, inputs))
            (d / "final").mkdir(parents=True, exist_ok=True)
            (d / DONE_FILE).write_text(json.dumps({"kind": kind, "settings": settings, "inputs": inputs}, default=str))
        return super().run(kind, settings, inputs, build)


@pytest.fixture
def table(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    ctx = lambda i: {"title": f"t{i}", "text": f"passage number {i}", "passage_id": str(i)}  # noqa: E731
    (data / "train.json").write_text(json.dumps([{"question": f"q {i}?", "answers": [str(i)], "positive_ctxs": [ctx(i)], "negative_ctxs": [],
                                                  "hard_negative_ctxs": []} for i in range(8)]))
    (data / "qa.tsv").write_text("".join(f"q {i}?\t['{i}']\n" for i in range(4)))
    (data / "passages.tsv").write_text("id\ttext\ttitle\n" + "".join(f"{i}\tpassage number {i}\tt{i}\n" for i in range(8)))
    return {"name": "kinds", "title": "kinds", "processes": 8,
            "data": {"kind": "files", "data_dir": str(data), "train_files": ["train.json"], "qa_file": "qa.tsv", "passages": "passages.tsv"},
            "model": {"pretrained": "shipped:all-MiniLM-L6-v2", "model_type": "dpr"},
            "train": {"batch_size": 16, "max_steps": 10, "warmup_steps": 0, "hard_negatives": 0, "val_max_questions": 0},
            "seeds": [1], "rows": {"dpr": {"name": "dpr", "negatives": "given"}, "hybrid": {"name": "hybrid", "kind": "hybrid", "uses": "dpr"}}}


def _job(table, row, tmp_path, **extra):
    return ExperimentJob(table=json.loads(json.dumps(table)), row=row, seed=1, stages_dir=str(tmp_path / "stages"), **extra)


@pytest.fixture
def no_training(monkeypatch):
    import taser.pipeline.rows as rows

    calls = []
    monkeypatch.setattr(train_module, "run_training", lambda model, files, train, out, *a, **k: calls.append(str(out)))
    monkeypatch.setattr(rows, "train_under_torchrun", lambda model, files, train, out, processes: calls.append(str(out)))
    return calls


def _dpr_trained_on_an_a100_node(monkeypatch, table, tmp_path) -> str:
    _machine(monkeypatch, 8, bf16=True)
    dpr = RowRun(_job(table, "dpr", tmp_path), MarkDone(tmp_path / "stages"))
    return dpr.trained(dpr.table.rows["dpr"], 1).key


@pytest.mark.parametrize("scheduled", [False, True])
def test_a_hybrid_on_a_v100_finds_the_model_its_row_trained_on_a100s(monkeypatch, table, tmp_path, no_training, scheduled):
    dpr_key = _dpr_trained_on_an_a100_node(monkeypatch, table, tmp_path)
    _machine(monkeypatch, 1, bf16=False)  # the evaluate class: one GPU of another generation (fp16)
    hybrid = RowRun(_job(table, "hybrid", tmp_path, scheduled=scheduled))
    stage = hybrid.trained(hybrid.table.rows["dpr"], 1)
    assert (stage.key, stage.built, no_training) == (dpr_key, False, [])
    assert json.loads((stage.dir / DONE_FILE).read_text())["settings"]["train"]["precision"] == "bf16"


def test_a_scheduled_job_never_trains_another_rows_model_it_does_not_find(monkeypatch, table, tmp_path, no_training):
    _machine(monkeypatch, 1, bf16=False)
    hybrid = RowRun(_job(table, "hybrid", tmp_path, scheduled=True))
    with pytest.raises(StageNotPlanned, match="row dpr's model at seed 1 is not in the store"):
        hybrid.trained(hybrid.table.rows["dpr"], 1)
    assert no_training == []


def test_a_rows_training_requeued_onto_another_generation_is_refused_naming_the_key_found(monkeypatch, table, tmp_path, no_training):
    dpr_key = _dpr_trained_on_an_a100_node(monkeypatch, table, tmp_path)
    _machine(monkeypatch, 8, bf16=False)  # the same job, requeued onto a V100 node
    dpr = RowRun(_job(table, "dpr", tmp_path))
    with pytest.raises(RecipeSplit, match=f"{dpr_key} \\(global_batch 128, precision bf16, done\\)"):
        dpr.trained(dpr.table.rows["dpr"], 1)
    assert no_training == []
    pinned = {**table, "train": {**table["train"], "precision": "fp16"}}  # a pinned precision is a recipe of its own
    dpr = RowRun(_job(pinned, "dpr", tmp_path))
    assert dpr.trained(dpr.table.rows["dpr"], 1).built and len(no_training) == 1


def test_a_model_trained_on_two_generations_is_refused_to_the_rows_that_use_it(monkeypatch, table, tmp_path, no_training):
    first = _dpr_trained_on_an_a100_node(monkeypatch, table, tmp_path)
    _machine(monkeypatch, 8, bf16=False)
    second = RowRun(_job({**table, "train": {**table["train"], "precision": "auto"}}, "dpr", tmp_path), MarkDone(tmp_path / "stages"))
    with pytest.raises(RecipeSplit):  # its own job refuses to make the second
        second.trained(second.table.rows["dpr"], 1)
    # made anyway (an older version, a copied store): a row that uses it is told of both
    settings = json.loads((tmp_path / "stages" / first / DONE_FILE).read_text())["settings"]
    inputs = json.loads((tmp_path / "stages" / first / DONE_FILE).read_text())["inputs"]
    other = {**settings, "train": {**settings["train"], "precision": "fp16"}}
    twin = tmp_path / "stages" / stage_key("train", other, inputs)
    twin.mkdir()
    (twin / DONE_FILE).write_text(json.dumps({"kind": "train", "settings": other, "inputs": inputs}))
    _machine(monkeypatch, 0, bf16=False)  # a job of a third kind (here a CPU) finds both and cannot choose
    hybrid = RowRun(_job({**table, "train": {**table["train"], "precision": "auto"}}, "hybrid", tmp_path))
    with pytest.raises(RecipeSplit, match="trained 2 times"):
        hybrid.trained(hybrid.table.rows["dpr"], 1)


def test_a_prepare_job_on_a_cpu_node_does_not_warn_of_another_recipe(monkeypatch, table, tmp_path, caplog, no_training):
    """A prepare job builds the CPU stages only: its one process is not a recipe (it warned of "another recipe than the table's")."""
    import logging

    from taser.pipeline.stages import PrepareStore

    _machine(monkeypatch, 0, bf16=False)
    prepare = RowRun(_job(table, "dpr", tmp_path, phase="prepare"), PrepareStore(tmp_path / "stages"))
    with caplog.at_level(logging.WARNING, logger="taser.pipeline.rows"):
        prepare.trained(prepare.table.rows["dpr"], 1)
    assert not [r for r in caplog.records if "another recipe" in r.getMessage()] and no_training == []
    dpr = RowRun(_job(table, "dpr", tmp_path))  # the row's own job on that node does: it trains on 1 process, not the table's 8
    with caplog.at_level(logging.WARNING, logger="taser.pipeline.rows"):
        dpr.trained(dpr.table.rows["dpr"], 1)
    assert [r for r in caplog.records if "another recipe" in r.getMessage()] and len(no_training) == 1


def test_a_model_of_the_same_recipe_on_other_training_data_is_not_taken(monkeypatch, table, tmp_path, no_training):
    _machine(monkeypatch, 8, bf16=True)
    dpr = RowRun(_job(table, "dpr", tmp_path), StageStore(tmp_path / "scratch"))
    files, ids = dpr.train_files(dpr.table.rows["dpr"], 1)
    model, train = dpr.model_settings(dpr.table.rows["dpr"]), dpr.train_settings(dpr.table.rows["dpr"], 1)
    from taser.pipeline.stage_settings import model_key, train_key

    settings = {"model": model_key(model), "train": train_key(train, model_key(model), 8, threads=False)}
    other = {"train_files": [{"size": 1, "sha256": "0" * 64}]}  # another training file
    stage = tmp_path / "stages" / stage_key("train", settings, other)
    stage.mkdir(parents=True)
    (stage / DONE_FILE).write_text(json.dumps({"kind": "train", "settings": settings, "inputs": other}, default=str))
    _machine(monkeypatch, 1, bf16=False)
    hybrid = RowRun(_job(table, "hybrid", tmp_path, scheduled=True))
    with pytest.raises(StageNotPlanned):
        hybrid.trained(hybrid.table.rows["dpr"], 1)
    alone = RowRun(_job(table, "hybrid", tmp_path))  # run by hand: it trains dpr's model itself, as this machine trains it
    built = alone.trained(alone.table.rows["dpr"], 1)
    assert built.built and len(no_training) == 1 and built.dir.name != stage.name
    assert json.loads((built.dir / DONE_FILE).read_text())["settings"]["train"]["precision"] == "fp16"


def test_a_hybrid_on_a_v100_finds_the_index_its_row_encoded_on_a100s(monkeypatch, table, tmp_path, no_training):
    """dpr's job encodes its index in the precision its GPUs resolve (bf16): the hybrid's 1-GPU job on a V100
    (fp16) must use it, not encode 21M passages again; scheduled and finding none, it refuses."""
    class MarkIndexDone(MarkDone):
        def run(self, kind, settings, inputs, build):
            if kind == "dense-index":
                d = self.dir(stage_key(kind, settings, inputs))
                d.mkdir(parents=True, exist_ok=True)
                (d / DONE_FILE).write_text(json.dumps({"kind": kind, "settings": settings, "inputs": inputs}, default=str))
            return super().run(kind, settings, inputs, build)

    _machine(monkeypatch, 8, bf16=True)
    dpr = RowRun(_job(table, "dpr", tmp_path), MarkIndexDone(tmp_path / "stages"))
    index = dpr.dense_index(dpr.table.rows["dpr"], 1)
    _machine(monkeypatch, 1, bf16=False)
    hybrid = RowRun(_job(table, "hybrid", tmp_path, scheduled=True))
    found = hybrid.dense_index(hybrid.table.rows["dpr"], 1)
    assert (found.key, found.built) == (index.key, False) and no_training == []
    record = json.loads((index.dir / DONE_FILE).read_text())
    twin_settings = {**record["settings"], "precision": "fp32"}  # the same index encoded a second time, in another precision
    twin = index.dir.parent / stage_key("dense-index", twin_settings, record["inputs"])
    twin.mkdir()
    (twin / DONE_FILE).write_text(json.dumps({**record, "settings": twin_settings}))
    split = RowRun(_job(table, "hybrid", tmp_path, scheduled=True))
    with pytest.raises(RecipeSplit, match="encoded 2 times"):
        split.dense_index(split.table.rows["dpr"], 1)
    (twin / DONE_FILE).unlink()
    (index.dir / DONE_FILE).unlink()
    hybrid = RowRun(_job(table, "hybrid", tmp_path, scheduled=True))
    with pytest.raises(StageNotPlanned, match="row dpr's index at seed 1 is not in the store"):
        hybrid.dense_index(hybrid.table.rows["dpr"], 1)
