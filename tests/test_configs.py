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
    # the shipped SQuAD questions are named as the squad_cpu table names them (not `dev`, after their file); BEIR by its directory
    assert qa.dataset == "SQuAD" and beir.dataset is None and job("evaluate", "dataset=mine").dataset == "mine"
    assert job("evaluate", "data=nq").dataset is None  # its QA file's name: nq-test
    assert job("train", "train.tensorboard=true").train.tensorboard is True


def test_evaluate_takes_the_readmes_search_settings():
    """Catches the search settings the README tells users to change at load time being refused
    when the config is composed (as `index.ef_search=512` was: `index` is a path there)."""
    import re

    from taser.retrieval.index_types import SearchSettings

    readme = (ROOT / "docs" / "encoding.md").read_text()
    sentence = readme[readme.index("Search settings are\nchanged at load time"):][:400]
    overrides = re.findall(r"(search\.\w+=\d+)", sentence)
    assert len(overrides) == 2, sentence
    assert job("evaluate", *overrides).search == SearchSettings(ef_search=512, nprobe=256)
    assert job("evaluate").search == SearchSettings() and job("evaluate").retriever_settings().search == SearchSettings()
    assert job("evaluate", "search.ef_search=64").retriever_settings().search.ef_search == 64
    assert "search.nprobe must be >= 1" in rejection("evaluate", "search.nprobe=0")


def test_misspelt_hybrid_key():
    text = rejection("evaluate", "retriever=hybrid", "+hybrid.lamda=2")
    assert "lamda" in text and "HybridSettings" in text


def test_a_missing_model_path_is_refused_when_the_train_config_is_read():
    """Before any weights, data or torch: scripts/train.py imports the training stack only after this."""
    with pytest.raises(FileNotFoundError, match="model path not found: /no/such/model"):
        job("train", "model.pretrained=/no/such/model")
    assert job("train", "model.pretrained=org/hub-name").model.pretrained == "org/hub-name"  # a hub name is resolved later, not here


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


def test_building_an_index_does_not_import_torch(tmp_path):
    """Catches torch (or transformers) imported while building an index, at import or at run
    time (a lazy import inside the build, its config or a type that trains): torch would add
    ~190 MB to a peak the index benchmark holds to index + one shard + 1 GB. The script and the
    library are run in a fresh process on small embeddings; the test process has torch loaded."""
    import numpy as np

    from taser.retrieval.embeddings import ShardWriter, passages_identity

    rows, dim = 300, 16
    passages = tmp_path / "passages.tsv"
    passages.write_text("id\ttext\ttitle\n" + "".join(f"{i}\tpassage {i}\tTitle\n" for i in range(1, rows + 1)))
    manifest = {"checkpoint": {"name": "ckpt"}, "passages": passages_identity(passages, rows), "num_shards": 1, "shard_id": 0,
                "start": 0, "end": rows, "chunk_size": 100, "dtype": "float16"}
    writer, vectors = ShardWriter(tmp_path / "emb", manifest), np.random.default_rng(0).normal(size=(rows, dim))
    for i in range(writer.num_chunks):
        start, end = writer.chunk_rows(i)
        writer.write_chunk(i, vectors[start:end], [str(r + 1) for r in range(start, end)])
    writer.finish(dim)
    code = f"""
import atexit, json, runpy, sys
atexit.register(lambda: print("IMPORTED", json.dumps(sorted({{m.split(".")[0] for m in sys.modules}} & {{"torch", "transformers"}}))))
sys.path.insert(0, {str(ROOT / "scripts")!r})  # as `python scripts/build_index.py` has it
sys.argv = ["build_index.py", "embeddings={tmp_path / 'emb'}", "out_dir={tmp_path / 'ivf'}", "index.type=ivf_pq", "index.pq_m=8"]
runpy.run_path({str(ROOT / "scripts" / "build_index.py")!r}, run_name="__main__")  # the script as a user runs it
from taser.pipeline.index import build_index
from taser.retrieval.faiss_index import load_index
from taser.retrieval.index_types import IndexConfig
build_index({str(tmp_path / "emb")!r}, {str(tmp_path / "sq8")!r}, IndexConfig("hnsw_sq8", hnsw_m=8, num_shards=2, train_size=200))
index = load_index({str(tmp_path / "sq8")!r})
assert load_index({str(tmp_path / "ivf")!r}).search(index.parts[0].index.reconstruct_n(0, 2), 5)[1][0]
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "ivf" / "index.json").is_file() and (tmp_path / "sq8" / "part_001" / "index.json").is_file()
    assert proc.stdout.strip().splitlines()[-1] == "IMPORTED []", proc.stdout
