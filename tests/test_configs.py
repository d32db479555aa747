"""Typed configs: every script's config composes against its schema, and each kind of mistake is
rejected when the config is composed or typed -- before any model, data or index is loaded --
with a message naming the key and what is allowed."""

import subprocess
import sys

import pytest
from conftest import ROOT, tiny_model_cfg
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException

from taser.cli import CONFIG_DIR, typed
from taser.data.config import DataConfig
from taser.models.loading import check_settings, load_model
from taser.models.settings import ModelSettings
from taser.pipeline.jobs import DemoJob, EncodeJob, EvaluateJob, IndexJob, MineJob, PrepareSquadJob, ReportJob, TrainJob
from taser.precision import Precision
from taser.training.config import TrainConfig

SCRIPTS = {"train": TrainJob, "encode_passages": EncodeJob, "build_index": IndexJob, "evaluate": EvaluateJob,
           "mine_negatives": MineJob, "prepare_squad": PrepareSquadJob, "demo": DemoJob, "report": ReportJob}
REQUIRED = {"encode_passages": ["checkpoint=ckpt"], "build_index": ["embeddings=emb"], "evaluate": ["checkpoint=c", "index=i"], "report": ["runs=[r]"]}


def job(name: str, *overrides: str):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return typed(compose(config_name=name, overrides=[*REQUIRED.get(name, []), *overrides]))


def rejection(name: str, *overrides: str) -> str:
    """The whole message of the error composing or typing the config (the cause included)."""
    with pytest.raises((ConfigCompositionException, ValueError)) as info:
        job(name, *overrides)
    err, text = info.value, ""
    while err is not None:
        text += f"{err}\n"
        err = err.__cause__
    return text


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_every_script_config_composes_to_its_schema(name):
    cfg = job(name)
    assert isinstance(cfg, SCRIPTS[name])


def test_defaults_come_from_the_schemas():
    train = job("train")
    assert train.train == TrainConfig(sampling_rates=None)  # the YAML repeats no default
    assert train.train.save_every == TrainConfig().save_every and train.train.precision == Precision.auto
    assert train.model.model_type == "dpr" and train.model.pretrained is None and train.model.pooling is None
    assert train.data.train_files == ["outputs/data/squad/train.json"]
    assert job("train", "model=taser_seq").model.taser.routing == "learned_sequence"
    assert job("demo").train.max_steps == 50 and job("demo").train.precision == Precision.auto


def test_index_presets():
    assert job("build_index").index.hnsw_m == 32  # a sane default for 21M passages
    dpr = job("build_index", "index_preset=dpr_hnsw").index
    assert (dpr.type, dpr.hnsw_m, dpr.ef_construction, dpr.ef_search) == ("hnsw", 512, 200, 128)
    assert "index.type=auto needs index.memory_gb" in rejection("build_index", "index.type=auto")


def test_misspelt_train_key():
    text = rejection("train", "+train.batch_szie=8")
    assert "batch_szie" in text and "TrainConfig" in text


def test_non_integer_batch_size():
    text = rejection("train", "train.batch_size=eight")
    assert "train.batch_size" in text and "'eight'" in text


def test_unknown_precision_names_the_allowed_ones():
    text = rejection("train", "train.precision=bf61")
    assert "train.precision" in text and "bf61" in text and all(p in text for p in ("auto", "fp32", "bf16", "fp16"))
    assert "fp32" in rejection("encode_passages", "precision=fp23")


def test_misspelt_model_key_with_a_checkpoint():
    text = rejection("train", "+model.poolling=mean", "model.init_checkpoint=somewhere")
    assert "poolling" in text and "ModelSettings" in text


def test_misspelt_data_key():
    text = rejection("train", "+data.dev_flie=dev.json")
    assert "dev_flie" in text and "DataConfig" in text


def test_evaluate_task_defaults():
    qa = job("evaluate")
    assert qa.task == "qa" and qa.bm25.index_dir == "outputs/data/squad/bm25-pyserini"  # as before tasks existed
    beir = job("evaluate", "task=beir", "beir.dir=/data/beir/scifact/", "retriever=bm25", "bm25.backend=bm25s")
    assert beir.beir.work_dir == "outputs/beir/scifact" and beir.bm25.index_dir is None  # BEIR's BM25 index: in beir.work_dir
    assert beir.beir.ignore_identical_ids is True and beir.beir.split == "test"
    assert job("evaluate", "task=beir", "beir.dir=x", "beir.ignore_identical_ids=false").beir.ignore_identical_ids is False
    assert job("evaluate", "index=null").index is None  # a flat index is built in out_dir
    assert job("train", "train.tensorboard=true").train.tensorboard is True


def test_misspelt_hybrid_key():
    text = rejection("evaluate", "retriever=hybrid", "+hybrid.lamda=2")
    assert "lamda" in text and "HybridSettings" in text


@pytest.mark.parametrize(
    "name, overrides, words",
    [
        ("train", ["model.similarity=cosinus"], ["model.similarity", "cosinus", "dot, cosine, l2"]),
        ("train", ["model=taser", "model.taser.routing=learned"], ["model.taser.routing", "learned_token"]),
        ("train", ["model.taser.routing=learned_token"], ["applies only to model_type=taser"]),
        ("build_index", ["index.type=ivf"], ["index.type", "auto, flat, hnsw, hnsw_sq8, ivf_pq"]),
        ("evaluate", ["retriever=sparse"], ["retriever", "dense, bm25, hybrid"]),
        ("evaluate", ["retriever=hybrid", "checkpoint=null"], ["retriever=hybrid needs checkpoint"]),
        ("evaluate", ["data.match=glob"], ["data.match", "string, regex"]),
        ("evaluate", ["task=trec"], ["task", "qa, beir, entity_questions"]),
        ("evaluate", ["task=beir"], ["task=beir needs beir.dir"]),
        ("evaluate", ["task=entity_questions"], ["task=entity_questions needs entity_questions.dir"]),
        ("evaluate", ["+beir.ignore_ids=false"], ["ignore_ids", "BeirSettings"]),
        ("report", ["beir_metrics=[nDCG@20]"], ["unknown BEIR metric", "nDCG@10"]),
        ("report", ["runs=[]"], ["at least one results.json"]),
        ("train", ["train.batch_size=0"], ["train.batch_size must be an integer >= 1"]),
        ("train", ["train.temperature=-1"], ["train.temperature must be > 0"]),
        ("train", ["model.dropout=1.5"], ["model.dropout must be in [0, 1)"]),
        ("train", ["model.pretrained=x", "model.init_checkpoint=y"], ["both set"]),
        ("encode_passages", ["shard_id=3", "num_shards=2"], ["shard_id must be in 0..1"]),
        ("mine_negatives", ["retriever=dense"], ["retriever=dense needs checkpoint"]),
        ("demo", ["bm25.backend=lucene"], ["bm25.backend", "pyserini, bm25s"]),
    ],
)
def test_other_mistakes_name_the_key(name, overrides, words):
    text = rejection(name, *overrides)
    for word in words:
        assert word in text, (word, text)


def test_a_checkpoint_honours_or_refuses_each_setting(tmp_path, tiny_pretrained, tokenizer):
    model, _ = load_model(tiny_model_cfg(tiny_pretrained, "shared"))  # [CLS], not normalised, dot, 64 tokens
    model.save(tmp_path / "ckpt", tokenizer)
    ckpt = {"model_type": "shared", "init_checkpoint": str(tmp_path / "ckpt")}
    # honoured: how the weights run
    continued, _ = load_model({**ckpt, "max_length": 32, "dropout": 0.0, "attention": "eager"})
    assert continued.config.max_length == 32 and continued.question_encoder.config._attn_implementation == "eager"
    # the checkpoint's own when left unset, or when equal
    assert load_model({**ckpt, "pooling": "cls"})[0].config.pooling == "cls"
    # refused: what the weights are, with no weights read
    for key, value, saved in (("pooling", "mean", "cls"), ("normalize", True, "False"), ("similarity", "cosine", "dot")):
        with pytest.raises(ValueError, match=f"model.{key}={value} conflicts with model.init_checkpoint=.*saved with {key}={saved}"):
            check_settings({**ckpt, key: value})
    with pytest.raises(ValueError, match="holds a 'shared' model, but model_type 'dpr' was asked for"):
        check_settings({**ckpt, "model_type": "dpr"})


def test_a_taser_checkpoint_refuses_other_taser_settings(tmp_path, tiny_pretrained, tokenizer):
    taser = {"specialize_every": 1, "routing": "learned_sequence"}
    model, _ = load_model(tiny_model_cfg(tiny_pretrained, "taser", taser=taser))
    model.save(tmp_path / "ckpt", tokenizer)
    ckpt = {"model_type": "taser", "init_checkpoint": str(tmp_path / "ckpt")}
    assert check_settings({**ckpt, "taser": taser}).taser["routing"] == "learned_sequence"
    with pytest.raises(ValueError, match=r"taser.routing=deterministic \(checkpoint: learned_sequence\)"):
        check_settings({**ckpt, "taser": {"specialize_every": 1}})


def test_settings_from_python_refuse_unknown_keys():
    with pytest.raises(ValueError, match="unknown model settings \\['poolling'\\]"):
        ModelSettings.from_value({"poolling": "mean"})
    with pytest.raises(ValueError, match="unknown train settings"):
        TrainConfig.from_value({"batch_szie": 8})
    with pytest.raises(ValueError, match="2 rates for 1 data.train_files"):
        DataConfig(train_files=["a.json"], sampling_rates=[1.0, 2.0])


@pytest.mark.slow
def test_script_stops_before_loading_anything(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "train.py"), "train.precision=bf61", f"output_dir={out}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "train.precision" in proc.stderr and "bf61" in proc.stderr
    assert "Loading weights" not in proc.stderr and not out.exists()


def test_building_an_index_does_not_import_torch():
    """`build_index` reads typed configs but never runs a model: torch would add ~190 MB to its
    peak memory, which the index benchmark holds to index + one shard + 1 GB."""
    import subprocess
    import sys

    code = "import sys, taser.cli, taser.pipeline.index; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"
