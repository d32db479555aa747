"""Every DPR experiment as a table preset: each figure is its entry of the one reference file, the
rows ask for the settings their paper's row describes, and rows that share a recipe share its stages."""

import logging
from functools import cache

import pytest
import yaml
from conftest import ROOT, tiny_model_cfg
from test_experiment import job_of

from taser.evaluation.reference_figures import FIGURES_FILE, reference_figures
from taser.pipeline.rows import RowRun
from taser.pipeline.stages import PlannedStore
from taser.training.config import TrainConfig

TABLES = ROOT / "configs" / "table"
PRESETS = sorted(p.stem for p in TABLES.glob("*.yaml"))


@cache
def table(name: str):
    return job_of([f"table={name}", f"row={next(iter(yaml.safe_load((TABLES / f'{name}.yaml').read_text())['table']['rows']))}"]).table


def train_of(t, key: str) -> TrainConfig:
    return TrainConfig.from_value({**t.train, **t.rows[key].train})


def test_every_papers_experiment_has_a_preset():
    """DPR's Table 2 (five datasets, §5.2's cross-dataset rows), Table 3 (three blocks), Figure 1, Tables 4, 5 and 6."""
    for name in ("dpr_table2", "dpr_table3", "dpr_figure1", "dpr_table4", "dpr_table5", "dpr_table6"):
        assert name in PRESETS
    cited = {row.cites for name in PRESETS for row in table(name).rows.values() if row.cites}
    entries = set(yaml.safe_load(FIGURES_FILE.read_text()))
    speed = "dpr.section5_4.speed"  # §5.4's figures sit beside the speed benchmark's own, not in a table
    assert speed in (ROOT / "benchmarks" / "dpr_speed" / "run.py").read_text()
    assert entries - cited == {speed}, "every other figure of the reference file is carried by a preset row"


@pytest.mark.parametrize("name", PRESETS)
def test_each_figure_is_the_reference_files(name):
    for key, row in table(name).rows.items():
        if row.reference:
            assert row.cites and row.reference == reference_figures(row.cites), (name, key)


def test_a_figure_that_differs_from_the_reference_file_is_refused():
    with pytest.raises(ValueError, match=r"row dpr: reference \{'top20': 78.5, 'top100': 85.4\} differs from dpr.table2.nq.single"):
        job_of(["table=dpr_nq", "row=dpr", "table.rows.dpr.reference.top20=78.5"])
    with pytest.raises(ValueError, match="names no source: set cites"):
        job_of(["table=dpr_nq", "row=dpr", "table.rows.dpr.cites=null"])
    with pytest.raises(ValueError, match="'dpr.table2.nq.singel' is not an entry"):
        job_of(["table=dpr_nq", "row=dpr", "table.rows.dpr.cites=dpr.table2.nq.singel"])


def test_table3_has_its_three_blocks_whole():
    t = table("dpr_table3")
    top = {key: train_of(t, key) for key in ("one-of-n-random", "one-of-n-bm25", "one-of-n-gold")}
    assert all(not c.in_batch for c in top.values())
    assert [(c.other_negatives, c.hard_negatives, c.gold_negatives) for c in top.values()] == [(7, 0, 0), (0, 7, 0), (0, 0, 7)]
    middle = [train_of(t, k) for k in ("inbatch-b8", "inbatch-b32", "inbatch-b128")]
    assert [(c.batch_size, c.hard_negatives, c.in_batch) for c in middle] == [(8, 0, True), (32, 0, True), (128, 0, True)]
    bottom = [train_of(t, k) for k in ("bm25-1-b32", "bm25-2-b32", "bm25-1-b128")]
    assert [(c.batch_size, c.hard_negatives) for c in bottom] == [(32, 1), (32, 2), (128, 1)]
    assert t.rows["bm25-1-b32"].reference == {"top5": 65.0, "top20": 77.3}  # the batch-32 row's, not the batch-128 one's


def test_table6_has_its_four_cells_and_cosine_indexes_unit_vectors():
    from taser.models.settings import ModelSettings

    t = table("dpr_table6")
    cells = {}
    for key, row in t.rows.items():
        model = ModelSettings.from_value({**t.model, **row.model})
        cells[(str(model.similarity or "dot"), train_of(t, key).loss)] = key
        if model.similarity == "cosine":
            assert model.normalize is True
    assert set(cells) == {("dot", "nll"), ("dot", "triplet"), ("l2", "nll"), ("l2", "triplet"), ("cosine", "nll")}


def planned(name: str, row: str, seed: int = 1) -> tuple[RowRun, dict[str, str]]:
    """The row's stages as the table plans them: label -> stage key."""
    job = job_of([f"table={name}", f"row={row}"])
    run = RowRun(job, PlannedStore())
    run.evaluate(job.table.rows[row], seed)
    return run, {label: stage.key for label, stage in run.stages}


@cache
def trained_key(name: str, row: str) -> str:
    _, stages = planned(name, row)
    return next(key for label, key in stages.items() if label.startswith("train "))


def test_table2_shares_each_recipe_across_its_datasets():
    multi = {trained_key("dpr_table2", f"{ds}-multi") for ds in ("nq", "trivia", "webq", "trec", "squad")}
    assert len(multi) == 1 and multi == {trained_key("dpr_nq", "dpr-multi")}
    nq = trained_key("dpr_table2", "nq-single")
    assert trained_key("dpr_table2", "webq-nq-trained") == trained_key("dpr_table2", "trec-nq-trained") == nq == trained_key("dpr_nq", "dpr")
    singles = {trained_key("dpr_table2", f"{ds}-single") for ds in ("nq", "trivia", "webq", "trec", "squad")}
    assert len(singles) == 5
    assert trained_key("dpr_table2", "webq-single") == trained_key("dpr_table4", "webq-dpr")  # Table 4 reads Table 2's retrievers


def test_small_datasets_train_long_enough_to_leave_their_warm_up():
    """WQ and CuratedTREC: for any training set of at least 1,000 questions (7 steps an epoch at 128 questions
    a step), the warm-up is at most a fifth of the run; 1,237 steps would not be."""
    steps_per_epoch = {"webq": 1000 // 128, "trec": 1000 // 128}
    for name, rows in (("dpr_table2", ("webq-single", "trec-single")), ("dpr_table4", ("webq-dpr", "trec-dpr"))):
        t = table(name)
        for key in rows:
            cfg = train_of(t, key)
            total = cfg.epochs * steps_per_epoch[key.split("-")[0]]
            assert cfg.epochs == 100 and cfg.warmup_steps <= total // 5, (name, key, cfg.warmup_steps, total)


def test_figure1_trains_fixed_seeded_subsets_each_its_own_recipe():
    t = table("dpr_figure1")
    sizes = {key: train_of(t, key).train_questions for key, row in t.rows.items() if row.kind == "trained"}
    assert sizes == {"n1k": 1000, "n10k": 10000, "n20k": 20000, "n40k": 40000, "all": None}
    assert all(train_of(t, key).train_subset == "seeded" for key in ("n1k", "n10k", "n20k", "n40k"))
    keys = {trained_key("dpr_figure1", key) for key in sizes}
    assert len(keys) == 5 and trained_key("dpr_figure1", "all") == trained_key("dpr_nq", "dpr")


def test_table5_rows_differ_only_in_their_positives():
    gold_run, gold = planned("dpr_table5", "gold")
    distant_run, distant = planned("dpr_table5", "distant")
    assert gold["negatives"] != distant["negatives"] and gold["BM25 index"] == distant["BM25 index"]
    assert "data.retriever.qas.nq-train" in table("dpr_table5").data.resources


def test_table4_reads_nqs_reader_at_the_papers_k():
    t = table("dpr_table4")
    assert t.rows["nq-reader-dpr"].reference == {"EM@50": 41.5, "EM@10": 40.8} and 50 in t.read.ks


def test_a_warm_up_that_outlasts_the_run_is_named(tmp_path, tiny_pretrained, mini_squad, caplog):
    from taser.pipeline.train import run_training

    train = {"batch_size": 2, "hard_negatives": 0, "max_steps": 2, "warmup_steps": 5, "progress": False, "precision": "fp32", "device": "cpu",
             "val_max_questions": 0}
    with caplog.at_level(logging.WARNING):
        run_training(tiny_model_cfg(tiny_pretrained), [str(mini_squad / "train.json")], train, tmp_path / "run")
    assert "train.warmup_steps=5 is not shorter than the run (2 steps)" in caplog.text and "at most 0.33x" in caplog.text
    for warmup, warned in ((2, True), (1, False)):  # a warm-up as long as the run never reaches the rate; one step shorter does
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            run_training(tiny_model_cfg(tiny_pretrained), [str(mini_squad / "train.json")], {**train, "warmup_steps": warmup},
                         tmp_path / f"run-{warmup}")
        assert ("is not shorter than the run" in caplog.text) == warned, warmup


def test_the_distant_row_setting_needs_a_miner():
    with pytest.raises(ValueError, match="positives=distant are found by the retriever that mines the row's negatives"):
        job_of(["table=dpr_table5", "row=distant", "table.rows.distant.negatives=given"])


def test_table4_multi_readers_start_from_nqs_reader_on_the_multi_set_retriever():
    from taser.pipeline.rows import row_stages

    inputs = {}

    class Recording(PlannedStore):
        def run(self, kind, settings, given, build):
            stage = super().run(kind, settings, given, build)
            inputs[stage.key] = given
            return stage

    def stages(row):
        job = job_of(["table=dpr_table4", f"row={row}"])
        run = RowRun(job, Recording())
        row_stages(run, job.table.rows[row], 1)
        return {label: stage for label, stage in run.stages}

    nq_reader = stages("nq-reader-dpr")["train reader on DPR"].key
    for ds in ("webq", "trec"):
        multi = stages(f"{ds}-reader-multi")
        assert multi["train reader on DPR"].key == nq_reader  # NQ's reader, built (or found) on the way
        assert multi["train DPR (Multi)"].key == trained_key("dpr_table2", f"{ds}-multi") == trained_key("dpr_nq", "dpr-multi")
        own = multi["train reader on DPR (Multi)"]
        assert own.key != nq_reader and inputs[own.key]["init"] == nq_reader


def test_the_miniature_runs_its_own_preset_with_the_ablations_runner():
    from conftest import load_script

    runner = load_script(ROOT / "benchmarks" / "dpr_cpu" / "run.py", "dpr_cpu_run")._runner()
    assert runner.PRESET == "dpr_cpu" and [r.key for r in runner.ROWS] == list(yaml.safe_load((TABLES / "dpr_cpu.yaml").read_text())["table"]["rows"])
    args = runner.parse_args(["--rows", "dpr", "n100"])
    assert args.records == ROOT / "benchmarks" / "dpr_cpu" / "runs" and args.results == ROOT / "benchmarks" / "dpr_cpu" / "results.md"
    args.argv = ["--rows", "dpr", "n100"]
    assert runner.report_command(args, [1, 2, 3]) == "python benchmarks/dpr_cpu/run.py --rows dpr n100"
    job = runner.job_for(args, runner.BY_KEY["inbatch-b8"], 2)
    row = job.table.rows["inbatch-b8"]
    assert job.table.name == "dpr_cpu" and {**job.table.train, **row.train}["max_steps"] == 100  # the row's own length wins
    t = job.table
    assert train_of(t, "n100").train_questions == 100 and t.rows["distant"].positives == "distant"


@pytest.mark.parametrize("name", [p for p in PRESETS if p.startswith("dpr_") and p != "dpr_cpu"])
def test_each_dpr_preset_names_the_recipe_source_it_follows(name):
    header = "".join(line for line in (TABLES / f"{name}.yaml").read_text().splitlines(keepends=True) if line.startswith("#"))
    assert "Recipe source: DPR's released NQ configuration" in header and "1e-5" in header
