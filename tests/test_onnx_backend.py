"""The ONNX Runtime backends of encoding (float32, dynamic int8, static int8, int8 attention QKV):
vectors within tolerance of PyTorch's for `dpr`, `shared` and `taser` (each side with its own
expert), ragged batches included; the exported graphs cached beside the checkpoint, reused, and
refused for other weights, other recipes or other calibration texts."""

import json

import numpy as np
import pytest
import torch
from conftest import tiny_model_cfg

from taser.models.encoding import encode_texts
from taser.models.graph_cache import CACHE_DIR, META_FILE
from taser.models.loading import load_checkpoint, load_model
from taser.models.onnx_backend import export_side, onnx_available

pytestmark = pytest.mark.skipif(not onnx_available(), reason="the onnx extra is not installed")

QUESTIONS = ["who wrote the origin of species?", "when did the berlin wall fall", "what is the capital city of a country that has a very long name?"]
PASSAGES = [("Charles Darwin", "On the Origin of Species was published in 1859 by Charles Darwin."), ("Berlin", "The wall fell in 1989."),
            ("Capitals", "Many capitals are named after rivers, saints and kings; some names are long and some are short, as this text is.")]
# largest absolute difference from PyTorch's fp32 vectors (unit-free, dot-product scale; these tiny models' entries reach 3.1).
# Measured here, largest over the three model types and both sides: onnx_int8 0.0018, onnx_int8_static 0.0167 (the passage
# graphs: ranges calibrated on other texts clip), onnx_int8_qkv 0.0022; the new recipes' bounds are about twice theirs.
TOLERANCE = {"onnx": 1e-4, "onnx_int8": 0.08, "onnx_int8_static": 0.03, "onnx_int8_qkv": 0.005}


def _checkpoint(tmp_path, pretrained, model_type, seed=0, **extra):
    torch.manual_seed(seed)
    model, tokenizer = load_model(tiny_model_cfg(pretrained, model_type, **extra))
    with torch.no_grad():  # TASER's experts start as copies of one FFN: make the question and passage experts differ, as trained ones do
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    path = tmp_path / model_type
    model.save(path, tokenizer)
    return path


@pytest.mark.parametrize("model_type, extra", [("dpr", {}), ("shared", {"pooling": "mean", "normalize": True}),
                                               ("taser", {"taser": {"specialize_every": 1}})])
@pytest.mark.parametrize("backend", ["onnx", "onnx_int8", "onnx_int8_static", "onnx_int8_qkv"])
def test_vectors_match_torch(tmp_path, tiny_pretrained, model_type, extra, backend):
    path = _checkpoint(tmp_path, tiny_pretrained, model_type, **extra)
    model, tokenizer = load_checkpoint(path, "cpu")
    model.eval()
    fast, _ = load_checkpoint(path, "cpu", backend=backend)
    for side, texts in (("question", QUESTIONS), ("passage", PASSAGES)):
        exact = encode_texts(model, tokenizer, texts, side, batch_size=2, precision="fp32")
        got = encode_texts(fast, tokenizer, texts, side, batch_size=2, precision="fp32")
        assert got.shape == exact.shape and got.dtype == np.float32
        assert np.abs(got - exact).max() <= TOLERANCE[backend], (side, np.abs(got - exact).max())
    if model_type == "taser":  # each side runs its own expert: the question graph on passages gives other vectors
        ids = tokenizer(["the same text"], return_tensors="pt")
        q = fast.encode(ids["input_ids"], ids["attention_mask"], "question")
        p = fast.encode(ids["input_ids"], ids["attention_mask"], "passage")
        assert not torch.allclose(q, p, atol=1e-3)
        torch.testing.assert_close(q, model.encode(ids["input_ids"], ids["attention_mask"], "question"), atol=TOLERANCE[backend], rtol=0)
    _assert_attention_fused(path / CACHE_DIR / backend, model.encoder_config.num_hidden_layers)  # TASER's specialised blocks too
    if model_type == "dpr":
        ids = tokenizer(QUESTIONS, return_tensors="pt", padding=True)  # the fused attention reads row lengths: left padding is refused
        with pytest.raises(ValueError, match=r"right-padded inputs.*row 0"):
            fast.encode(torch.flip(ids["input_ids"], dims=[1]), torch.flip(ids["attention_mask"], dims=[1]), "question")
        before = model.encoder_config._attn_implementation
        export_side(model, "question", tmp_path / "again.onnx")  # exports with the explicit attention, then gives the model its own back
        assert model.encoder_config._attn_implementation == before != "eager"


def _assert_attention_fused(cache, layers):
    import onnx

    for side in ("question", "passage"):
        ops = [n.op_type for n in onnx.load(str(cache / f"{side}.onnx")).graph.node]
        # one fused kernel per self-attention (QAttention: onnx_int8_qkv's), and not SDPA's export: no per-layer mask bias, no NaN guard
        assert ops.count("Attention") + ops.count("QAttention") == layers and "IsNaN" not in ops and "Softmax" not in ops, sorted(set(ops))
    assert json.loads((cache / META_FILE).read_text())["fused"]["passage"]["Attention"] == layers


def test_cache_is_reused_and_refused_for_other_weights(tmp_path, tiny_pretrained, caplog):
    import shutil

    path = _checkpoint(tmp_path, tiny_pretrained, "dpr")
    load_checkpoint(path, "cpu", backend="onnx")
    cache = path / CACHE_DIR / "onnx"
    graph = cache / "question.onnx"
    first = graph.stat().st_mtime_ns
    load_checkpoint(path, "cpu", backend="onnx")
    assert graph.stat().st_mtime_ns == first  # reused, not exported again
    # a cache written for other weights (a checkpoint directory copied over another's, say): refused and rebuilt
    other = _checkpoint(tmp_path / "other", tiny_pretrained, "dpr", seed=1)
    shutil.copytree(path / CACHE_DIR, other / CACHE_DIR)
    caplog.set_level("WARNING")
    fast, tokenizer = load_checkpoint(other, "cpu", backend="onnx")
    assert "written for other weights" in caplog.text
    model, _ = load_checkpoint(other, "cpu")
    model.eval()
    ids = tokenizer(["who?"], return_tensors="pt")
    torch.testing.assert_close(fast.encode(ids["input_ids"], ids["attention_mask"], "question"),
                               model.encode(ids["input_ids"], ids["attention_mask"], "question"), atol=1e-4, rtol=0)
    assert json.loads((other / CACHE_DIR / "onnx" / META_FILE).read_text())["backend"] == "onnx"


def test_onnx_backends_are_refused_without_the_extra_or_off_the_cpu(monkeypatch):
    from taser.models import backends

    assert backends.resolve_backend("auto", "cuda") == backends.Backend.torch
    monkeypatch.setattr(backends, "installed", lambda b: b == backends.Backend.torch)
    with pytest.raises(ValueError, match=r"needs the optional extra: pip install 'taser-retrieval\[fast\]'"):
        backends.resolve_backend("onnx", "cpu")
    with pytest.raises(ValueError, match="runs on the CPU only"):
        backends.resolve_backend("onnx_int8", "cuda")


def test_evaluate_with_the_onnx_backend(tmp_path, tiny_pretrained, mini_squad):
    """The backend reaches encoding through evaluate (passages and questions): the same top-k as
    torch, and results.json says which backend ran."""
    from taser.pipeline.evaluate import RetrieverSettings, evaluate_qa

    path = _checkpoint(tmp_path, tiny_pretrained, "dpr")
    results = {}
    for backend in ("torch", "onnx"):
        settings = RetrieverSettings("dense", path, None, batch_size=16, precision="fp32", device="cpu", backend=backend)
        results[backend] = evaluate_qa(settings, mini_squad / "dev.qa.tsv", mini_squad / "passages.tsv", tmp_path / f"eval-{backend}", k=20)
    assert results["onnx"]["backend"] == "onnx" and results["torch"]["backend"] == "torch"
    assert results["onnx"]["top_k"] == results["torch"]["top_k"]
    assert json.loads((tmp_path / "eval-onnx" / "dense-index" / "index" / "index.json").read_text())["backend"] == "onnx"
    # the torch run's index is not taken for the onnx backend's (nor the other way round)
    settings = RetrieverSettings("dense", path, None, batch_size=16, precision="fp32", device="cpu", backend="onnx")
    again = evaluate_qa(settings, mini_squad / "dev.qa.tsv", mini_squad / "passages.tsv", tmp_path / "eval-torch", k=20)
    assert again["top_k"] == results["torch"]["top_k"]
    assert json.loads((tmp_path / "eval-torch" / "dense-index" / "index" / "index.json").read_text())["backend"] == "onnx"


def test_vectors_of_another_recipe_are_not_reused_and_auto_is_recorded_as_resolved(tmp_path, tiny_pretrained, mini_squad, monkeypatch):
    from taser.models import backends
    from taser.pipeline.evaluate import RetrieverSettings, evaluate_qa
    from taser.retrieval.embeddings import ShardWriter

    path = _checkpoint(tmp_path, tiny_pretrained, "dpr")
    index_json = tmp_path / "eval" / "dense-index" / "index" / "index.json"
    settings = RetrieverSettings("dense", path, None, batch_size=16, precision="fp32", device="cpu", backend="onnx")
    evaluate_qa(settings, mini_squad / "dev.qa.tsv", mini_squad / "passages.tsv", tmp_path / "eval", k=20)
    first = json.loads(index_json.read_text())
    assert (first["backend"], first["backend_recipe"]) == ("onnx", backends.RECIPES["onnx"][1])
    # a newer recipe of the same backend: its graphs are rebuilt and the index of the older one's vectors is not reused
    monkeypatch.setitem(backends.RECIPES, backends.Backend.onnx, ("fused float32", 99))
    from taser.models import backend_choice

    monkeypatch.setattr(backend_choice, "choose", lambda kind, installed, recipes: ("onnx", "as this test chooses"))
    settings = RetrieverSettings("dense", path, None, batch_size=16, precision="fp32", device="cpu", backend="auto")
    result = evaluate_qa(settings, mini_squad / "dev.qa.tsv", mini_squad / "passages.tsv", tmp_path / "eval", k=20)
    again = json.loads(index_json.read_text())
    assert (again["backend"], again["backend_recipe"]) == ("onnx", 99) and result["backend"] == "onnx"  # auto, recorded as what it ran
    assert json.loads((path / CACHE_DIR / "onnx" / META_FILE).read_text())["recipe"] == 99
    # and a shard begun by one recipe does not resume under another
    manifest = {"checkpoint": "c", "passages": "p", "num_shards": 1, "shard_id": 0, "start": 0, "end": 4, "chunk_size": 2, "dtype": "float32"}
    ShardWriter(tmp_path / "emb", {**manifest, **backends.backend_record("onnx")})
    monkeypatch.setitem(backends.RECIPES, backends.Backend.onnx, ("fused float32", 100))
    with pytest.raises(ValueError, match="backend_recipe differ"):
        ShardWriter(tmp_path / "emb", {**manifest, **backends.backend_record("onnx")})
    with pytest.raises(ValueError, match="not auto"):
        backends.backend_record("auto")
    assert backends.backend_record("torch") == {}


def test_a_failed_export_gives_the_model_its_attention_and_padding_back(tmp_path, tiny_pretrained, monkeypatch):
    path = _checkpoint(tmp_path, tiny_pretrained, "dpr")
    model, _ = load_checkpoint(path, "cpu")
    before = (model.unpad, model.encoder_config._attn_implementation)

    def fail(*args, **kwargs):
        raise RuntimeError("export failed")

    monkeypatch.setattr(torch.onnx, "export", fail)
    with pytest.raises(RuntimeError, match="export failed"):
        export_side(model, "passage", tmp_path / "p.onnx")
    assert (model.unpad, model.encoder_config._attn_implementation) == before and before[1] != "eager"


def test_a_cached_graph_loads_without_pytorch_weights(tmp_path, tiny_pretrained, monkeypatch):
    from taser.models.biencoder import BiEncoder
    from taser.models.params import parameter_report

    path = _checkpoint(tmp_path, tiny_pretrained, "taser", taser={"specialize_every": 1})
    first, tokenizer = load_checkpoint(path, "cpu", backend="onnx_int8")
    assert first.parameter_counts == parameter_report(BiEncoder.load(path))

    def refuse(*a, **k):
        raise AssertionError("the weights were loaded into PyTorch although the graphs are cached")

    monkeypatch.setattr(BiEncoder, "load", refuse)
    again, _ = load_checkpoint(path, "cpu", backend="onnx_int8")
    assert again.parameter_counts == first.parameter_counts and again.config == first.config
    assert again.encoder_config.hidden_size == first.encoder_config.hidden_size
    ids = tokenizer(QUESTIONS, return_tensors="pt", padding=True)
    torch.testing.assert_close(again.encode(ids["input_ids"], ids["attention_mask"], "question"),
                               first.encode(ids["input_ids"], ids["attention_mask"], "question"), atol=0, rtol=0)


def test_int8_keeps_ffn_down_projections_float_and_rebuilds_an_older_recipe(tmp_path, tiny_pretrained, caplog):
    import onnx

    from taser.models.onnx_backend import RECIPES

    path = _checkpoint(tmp_path, tiny_pretrained, "taser", taser={"specialize_every": 1})
    load_checkpoint(path, "cpu", backend="onnx_int8")
    cache = path / CACHE_DIR / "onnx_int8"
    model, _ = load_checkpoint(path, "cpu")
    enc = model.encoder_config
    for side in ("question", "passage"):
        graph = onnx.load(str(cache / f"{side}.onnx")).graph
        shapes = {init.name: list(init.dims) for init in graph.initializer}
        float_weights = [n for n in graph.node if n.op_type == "MatMul" and any(x in shapes for x in n.input)]
        assert len(float_weights) == enc.num_hidden_layers  # one FFN down-projection per layer (the side's expert in TASER's)
        assert all(shapes[next(x for x in n.input if x in shapes)] == [enc.intermediate_size, enc.hidden_size] for n in float_weights)
        assert any(n.op_type in ("MatMulInteger", "DynamicQuantizeMatMul") for n in graph.node)
    meta = json.loads((cache / META_FILE).read_text())
    assert meta["recipe"] == RECIPES["onnx_int8"][1] == 4
    del meta["recipe"]  # a cache made before recipes were recorded (recipe 1: every MatMul in int8)
    (cache / META_FILE).write_text(json.dumps(meta))
    caplog.set_level("WARNING")
    load_checkpoint(path, "cpu", backend="onnx_int8")
    assert "made by recipe 1, this version makes fused int8 recipe 4" in caplog.text
    assert json.loads((cache / META_FILE).read_text())["recipe"] == 4


def _ops(path):
    import onnx

    return [n.op_type for n in onnx.load(str(path)).graph.node]


def test_static_int8_calibrates_once_and_runs_integer_matmuls(tmp_path, tiny_pretrained, caplog):
    """onnx_int8_static: the MatMuls take int8 activations whose ranges were calibrated (no per-batch
    DynamicQuantizeLinear), the FFN down-projections stay float32, and the calibration texts' digest
    is recorded: a cache calibrated on other texts is rebuilt."""
    import onnx

    from taser.models.onnx_backend import STATIC_FORMAT, calibration_digest, calibration_feeds, ffn_down_projections, fuse_transformer, quantize_int8_static

    path = _checkpoint(tmp_path, tiny_pretrained, "dpr")
    fast, tokenizer = load_checkpoint(path, "cpu", backend="onnx_int8_static")
    cache = path / CACHE_DIR / "onnx_int8_static"
    model = load_checkpoint(path, "cpu")[0]
    enc = model.encoder_config
    for side in ("question", "passage"):
        graph = onnx.load(str(cache / f"{side}.onnx")).graph
        ops = [n.op_type for n in graph.node]
        assert "DynamicQuantizeLinear" not in ops and "QuantizeLinear" in ops, sorted(set(ops))
        assert ops.count("QLinearMatMul" if STATIC_FORMAT == "QOperator" else "MatMul") >= 2 * enc.num_hidden_layers  # attention output, FFN up
        assert ops.count("Attention") == enc.num_hidden_layers  # the fused attention (its QKV projection) stays float32
        shapes = {init.name: list(init.dims) for init in graph.initializer}
        float_weights = [n for n in graph.node if n.op_type == "MatMul" and any(shapes.get(x) == [enc.intermediate_size, enc.hidden_size]
                                                                                for x in n.input)]  # fmt: skip
        assert len(float_weights) == enc.num_hidden_layers  # the FFN down-projections stay float32, as in onnx_int8
    # the passage graph's activation ranges are those of the shipped passages, tokenised as encoding does
    plain, fused, again = tmp_path / "p.onnx", tmp_path / "f.onnx", tmp_path / "s.onnx"
    export_side(model, "passage", plain)
    fuse_transformer(plain, fused, enc)
    feeds = calibration_feeds(tokenizer, fast.config, "passage")
    quantize_int8_static(fused, again, feeds, ffn_down_projections(fused, enc.intermediate_size, enc.hidden_size))

    def activation_scales(path):
        graph = onnx.load(str(path)).graph
        return sorted(float(onnx.numpy_helper.to_array(i)) for i in graph.initializer if i.name.endswith("_scale") and not i.dims)

    assert activation_scales(cache / "passage.onnx") == activation_scales(again) and len(activation_scales(again)) >= 2
    meta = json.loads((cache / META_FILE).read_text())
    assert meta["calibration"] == calibration_digest() and meta["format"] == STATIC_FORMAT
    meta["calibration"] = "other texts"
    (cache / META_FILE).write_text(json.dumps(meta))
    caplog.set_level("WARNING")
    load_checkpoint(path, "cpu", backend="onnx_int8_static")
    assert "calibrated on other texts" in caplog.text
    assert json.loads((cache / META_FILE).read_text())["calibration"] == calibration_digest()


def test_int8_qkv_quantises_the_fused_attention(tmp_path, tiny_pretrained):
    """onnx_int8_qkv: every fused attention becomes QAttention (int8 QKV projection), the FFN
    down-projections stay float32, the rest as onnx_int8."""
    path = _checkpoint(tmp_path, tiny_pretrained, "taser", taser={"specialize_every": 1})
    load_checkpoint(path, "cpu", backend="onnx_int8_qkv")
    enc = load_checkpoint(path, "cpu")[0].encoder_config
    for side in ("question", "passage"):
        ops = _ops(path / CACHE_DIR / "onnx_int8_qkv" / f"{side}.onnx")
        assert ops.count("QAttention") == enc.num_hidden_layers and "Attention" not in ops, sorted(set(ops))
        assert ops.count("MatMul") == enc.num_hidden_layers and "MatMulInteger" in ops  # one float FFN down-projection per layer


def test_each_onnx_recipe_has_its_own_key_and_cache(monkeypatch):
    from taser.models import backends

    assert set(backends.ONNX_BACKENDS) | set(backends.OPENVINO_BACKENDS) == {str(b) for b in backends.Backend} - {"auto", "torch"}
    assert not set(backends.ONNX_BACKENDS) & set(backends.OPENVINO_BACKENDS)
    assert set(backends.RECIPES) == {backends.Backend(b) for b in backends.ONNX_BACKENDS + backends.OPENVINO_BACKENDS}
    assert len({name for name, _ in backends.RECIPES.values()}) == len(backends.RECIPES)  # a recipe's name says which backend made it
    records = [backends.backend_record(b) for b in backends.ONNX_BACKENDS]
    assert len({(r["backend"], r["backend_recipe"]) for r in records}) == len(records)
    assert all(backends.installed(backends.Backend(b)) for b in backends.ONNX_BACKENDS)
    monkeypatch.setattr(backends, "onnx_available", lambda: False)  # without the extra, none of them is installed
    assert not any(backends.installed(backends.Backend(b)) for b in backends.ONNX_BACKENDS)


def test_bad_input_to_the_int8_recipes_says_what_is_wrong(tmp_path, tiny_pretrained, tokenizer):
    from taser.models.biencoder import BiEncoder
    from taser.models.onnx_backend import calibration_feeds, prepare_graphs, quantize_int8_static

    path = _checkpoint(tmp_path, tiny_pretrained, "dpr")
    config = BiEncoder.load(path).config
    with pytest.raises(ValueError, match="no ONNX graphs for backend 'torch'"):
        prepare_graphs(path, "torch")
    with pytest.raises(ValueError, match="calibration texts for the question graph: none given"):
        calibration_feeds(tokenizer, config, "question", texts=[])
    with pytest.raises(ValueError, match=r"\(title, text\) pairs"):
        calibration_feeds(tokenizer, config, "passage", texts=["a passage without its title"])
    with pytest.raises(ValueError, match="side must be one of"):
        calibration_feeds(tokenizer, config, "answer")
    feeds = calibration_feeds(tokenizer, config, "passage")
    # every shipped passage, truncated as encoding truncates them (the longest reach the checkpoint's max_length, 64 here)
    assert sum(len(f["input_ids"]) for f in feeds) == 128 and max(f["input_ids"].shape[1] for f in feeds) == config.max_length
    assert all((f["attention_mask"][:, :-1] >= f["attention_mask"][:, 1:]).all() for f in feeds)  # right-padded, as encoding feeds them
    with pytest.raises(ValueError, match="QOperator or QDQ"):
        quantize_int8_static(tmp_path / "a.onnx", tmp_path / "b.onnx", feeds, quant_format="QInt8")
    with pytest.raises(ValueError, match="at least one calibration batch"):
        quantize_int8_static(tmp_path / "a.onnx", tmp_path / "b.onnx", [])


def test_calibration_texts_are_the_shipped_package_data():
    """The texts moved from Python code to package data unchanged: the digest the caches record is
    the one the int8 graphs were calibrated under (a change of texts must be deliberate)."""
    from taser.models import calibration_texts
    from taser.models.onnx_backend import calibration_digest

    questions, passages = calibration_texts.questions(), calibration_texts.passages()
    assert len(questions) == len(passages) == 128 and all(len(p) == 2 and all(p) for p in passages)
    assert questions[0] == "Which NFL team represented the AFC at Super Bowl 50?"
    assert calibration_digest() == "fca15e4b440a58e0"


def test_learned_routing_exports_every_expert_and_keeps_each_units_own(tmp_path, tiny_pretrained):
    # a trace would freeze the example's split by expert into the graph (taser.models.moe._dispatch_traced)
    path = _checkpoint(tmp_path, tiny_pretrained, "taser", taser={"specialize_every": 1, "routing": "learned_token"})
    model, tokenizer = load_checkpoint(path, "cpu")
    fast, _ = load_checkpoint(path, "cpu", backend="onnx")
    for side, texts in (("question", QUESTIONS), ("passage", PASSAGES)):
        exact = encode_texts(model.eval(), tokenizer, texts, side, batch_size=3, precision="fp32")
        assert np.abs(encode_texts(fast, tokenizer, texts, side, batch_size=3, precision="fp32") - exact).max() <= TOLERANCE["onnx"]
