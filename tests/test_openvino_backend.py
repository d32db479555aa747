"""The OpenVINO backends of encoding (float32, bf16, NNCF int8, int8 with bf16): vectors within tolerance of PyTorch's
for `dpr`, `shared` and `taser` (deterministic and learned routing), each side a model of its own that
holds only its own experts; the precision stated, not OpenVINO's CPU default; the models cached beside
the checkpoint and rebuilt for other weights, recipes or calibration texts (a bf16 variant compiling
its float sibling's); a clear refusal where the package or the CPU's bf16 is missing."""

import json

import numpy as np
import pytest
import torch
from conftest import tiny_model_cfg

from taser.models import backends
from taser.models.encoding import encode_texts, encoding_runtime
from taser.models.graph_cache import CACHE_DIR, META_FILE
from taser.models.loading import load_checkpoint, load_model
from taser.models.openvino_backend import openvino_available
from taser.runtime import cpu_has_native_bf16

# `openvino`: make test-long runs these in a pytest process of their own. In a process that had compiled an OpenVINO model, a
# later test (tests/test_hub_data.py's torch.multiprocessing.spawn of gloo ranks after `datasets` tests) ended in a segfault.
pytestmark = [pytest.mark.skipif(not openvino_available("openvino_int8"), reason="the openvino extra is not installed"), pytest.mark.openvino]

QUESTIONS = ["who wrote the origin of species?", "when did the berlin wall fall", "what is the capital city of a country that has a very long name?"]
PASSAGES = [("Charles Darwin", "On the Origin of Species was published in 1859 by Charles Darwin."), ("Berlin", "The wall fell in 1989."),
            ("Capitals", "Many capitals are named after rivers, saints and kings; some names are long and some are short, as this text is.")]
# largest absolute difference from PyTorch's fp32 vectors (these tiny models' entries reach 3.1). Measured here (AMD EPYC,
# AVX512, native bf16), largest over the model types and sides: openvino 4.8e-7, openvino_bf16 0.00086, openvino_int8 0.027,
# openvino_int8_bf16 0.018.
TOLERANCE = {"openvino": 1e-4, "openvino_bf16": 0.005, "openvino_int8": 0.06, "openvino_int8_bf16": 0.06}
BF16 = tuple(b for b in backends.OPENVINO_BACKENDS if backends.ENGINE_PRECISION[b] == "bf16")
needs_bf16 = pytest.mark.skipif(not cpu_has_native_bf16(), reason="bf16 backends need a CPU with native bf16 (their refusal is tested)")


def _checkpoint(tmp_path, pretrained, model_type, seed=0, **extra):
    torch.manual_seed(seed)
    model, tokenizer = load_model(tiny_model_cfg(pretrained, model_type, **extra))
    with torch.no_grad():  # TASER's experts start as copies of one FFN: make them differ, as trained ones do
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    path = tmp_path / model_type
    model.save(path, tokenizer)
    return path


def _side_matmul_weights(model, side: str) -> int:
    """The weights of the linear layers a side's vector needs: its encoder's (not the pooler, which [CLS]
    and mean pooling skip), and of TASER's experts its own side's only."""
    other_expert = f"experts.{1 - {'question': 0, 'passage': 1}[side]}."
    encoder = "passage_encoder." if side == "passage" and model.passage_encoder is not None else "question_encoder."
    linears = [m for name, m in model.named_modules() if isinstance(m, torch.nn.Linear) and name.startswith(encoder)
               and "pooler" not in name and other_expert not in f"{name}." and "router" not in name]
    return sum(m.weight.numel() for m in linears)


MODELS = {"dpr": ("dpr", {}), "shared": ("shared", {"pooling": "mean", "normalize": True}), "taser": ("taser", {"taser": {"specialize_every": 1}}),
          "taser-learned-token": ("taser", {"taser": {"specialize_every": 1, "routing": "learned_token"}}),
          "taser-attention-token": ("taser", {"taser": {"specialize_every": 1, "specialize": "attention", "routing": "learned_token"}})}
# every model in float32; bf16 and int8 on the two-encoder and the specialised model (each conversion of int8 takes seconds)
CASES = [("openvino", m) for m in MODELS] + [(b, m) for b in ("openvino_bf16", "openvino_int8", "openvino_int8_bf16") for m in ("dpr", "taser")]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, tiny_pretrained):
    """One checkpoint per model, made when first asked for: the cases share it (and its cached models)."""
    made = {}

    def get(name):
        if name not in made:
            model_type, extra = MODELS[name]
            made[name] = _checkpoint(tmp_path_factory.mktemp(name), tiny_pretrained, model_type, **extra)
        return made[name]

    return get


@pytest.mark.parametrize("backend, name", [pytest.param(b, m, marks=needs_bf16 if b in BF16 else (), id=f"{b}-{m}") for b, m in CASES])
def test_vectors_match_torch(checkpoints, backend, name):
    model_type, extra = MODELS[name]
    path = checkpoints(name)
    model, tokenizer = load_checkpoint(path, "cpu")
    model.eval()
    fast, _ = load_checkpoint(path, "cpu", backend=backend)
    for side, texts in (("question", QUESTIONS), ("passage", PASSAGES)):
        exact = encode_texts(model, tokenizer, texts, side, batch_size=2, precision="fp32")
        got = encode_texts(fast, tokenizer, texts, side, batch_size=2, precision="fp32")
        assert got.shape == exact.shape and got.dtype == np.float32
        assert np.abs(got - exact).max() <= TOLERANCE[backend], (side, np.abs(got - exact).max())
    ids = tokenizer(["the same text"], return_tensors="pt")
    if model_type == "taser" and "routing" not in extra["taser"]:  # each side runs its own expert: the question model on passages gives other vectors
        q = fast.encode(ids["input_ids"], ids["attention_mask"], "question")
        assert not torch.allclose(q, fast.encode(ids["input_ids"], ids["attention_mask"], "passage"), atol=1e-3)
    converted_as = backends.CONVERTED_AS.get(backend, backend)  # a bf16 variant compiles its float sibling's models
    assert (backend == converted_as) != (backend in BF16) and not (backend != converted_as and (path / CACHE_DIR / backend).exists())
    meta = json.loads((path / CACHE_DIR / converted_as / META_FILE).read_text())
    assert meta["backend"] == converted_as and meta["recipe"] == backends.RECIPES[backends.Backend(backend)][1]
    if "routing" not in extra.get("taser", {}):  # each side holds its own weights only (TASER: its experts)
        assert meta["matmul_weights"] == {side: _side_matmul_weights(model, side) for side in ("question", "passage")}


def test_each_backend_states_its_precision_instead_of_openvinos_cpu_default(checkpoints):
    path = checkpoints("dpr")
    bf16 = (("openvino_bf16", "bf16"), ("openvino_int8_bf16", "bf16")) if cpu_has_native_bf16() else ()
    for backend, hint in (("openvino", "f32"), ("openvino_int8", "f32")) + bf16:
        fast, _ = load_checkpoint(path, "cpu", backend=backend)
        assert {c.get_property("INFERENCE_PRECISION_HINT").to_string() for c in fast.compiled.values()} == {hint}
        want = "bf16" if backend in BF16 else "fp32"
        assert encoding_runtime(fast, "auto")["precision"] == want == backends.vectors_precision(backend, "auto", torch.device("cpu"))
        assert encoding_runtime(fast, "auto")["backend"] == backend


def test_bf16_is_refused_on_a_cpu_without_native_bf16(tmp_path, tiny_pretrained, monkeypatch):
    import taser.runtime

    path = _checkpoint(tmp_path, tiny_pretrained, "dpr")
    monkeypatch.setattr(taser.runtime, "cpu_has_native_bf16", lambda: False)
    for backend, instead in (("openvino_bf16", "openvino"), ("openvino_int8_bf16", "openvino_int8")):
        with pytest.raises(ValueError, match=f"backend={backend} computes in bf16.*no native instructions.*Use backend={instead}$"):
            load_checkpoint(path, "cpu", backend=backend)
    assert not (path / CACHE_DIR).exists()  # refused before any conversion


def test_cache_is_reused_and_rebuilt_for_other_weights_recipes_and_calibration_texts(tmp_path, tiny_pretrained, checkpoints, monkeypatch, caplog):
    import shutil

    from taser.models.graph_cache import SIDES, calibration_digest, stale_reason, weights_digest

    path = _checkpoint(tmp_path, tiny_pretrained, "dpr")
    load_checkpoint(path, "cpu", backend="openvino")
    cache = path / CACHE_DIR / "openvino"
    first = (cache / "question.bin").stat().st_mtime_ns
    load_checkpoint(path, "cpu", backend="openvino")
    assert (cache / "question.bin").stat().st_mtime_ns == first  # reused, not converted again
    caplog.set_level("WARNING")
    monkeypatch.setitem(backends.RECIPES, backends.Backend.openvino, ("OpenVINO float32", 99))
    load_checkpoint(path, "cpu", backend="openvino")
    assert "made by recipe 1, this version makes OpenVINO float32 recipe 99" in caplog.text and (cache / "question.bin").stat().st_mtime_ns != first
    other = _checkpoint(tmp_path / "other", tiny_pretrained, "dpr", seed=1)
    shutil.copytree(path / CACHE_DIR, other / CACHE_DIR)
    fast, tokenizer = load_checkpoint(other, "cpu", backend="openvino")
    assert "written for other weights" in caplog.text
    model, _ = load_checkpoint(other, "cpu")
    ids = tokenizer(["who?"], return_tensors="pt")
    torch.testing.assert_close(fast.encode(ids["input_ids"], ids["attention_mask"], "question"),
                               model.eval().encode(ids["input_ids"], ids["attention_mask"], "question"), atol=TOLERANCE["openvino"], rtol=0)
    # int8 records the calibration texts it was calibrated on: other texts would rebuild it
    shared = checkpoints("dpr")
    load_checkpoint(shared, "cpu", backend="openvino_int8")
    root = shared / CACHE_DIR / "openvino_int8"
    assert json.loads((root / META_FILE).read_text())["calibration"] == calibration_digest()
    files = [f"{side}.{ext}" for side in SIDES for ext in ("xml", "bin")]
    identity, recipe = weights_digest(shared), backends.RECIPES[backends.Backend.openvino_int8]
    assert stale_reason(root, identity, recipe, calibration_digest(), files) is None
    assert stale_reason(root, identity, recipe, "other-texts", files).startswith("calibrated on other texts")


def test_int8_quantises_the_matrix_products(checkpoints):
    import openvino as ov

    path = checkpoints("taser")
    load_checkpoint(path, "cpu", backend="openvino_int8")
    for side in ("question", "passage"):
        converted = ov.Core().read_model(str(path / CACHE_DIR / "openvino_int8" / f"{side}.xml"))
        ops = [op.get_type_name() for op in converted.get_ops()]
        int8 = [op for op in converted.get_ops() if op.get_type_name() == "Constant" and op.get_output_element_type(0).get_type_name() in ("i8", "u8")]
        # an activation quantiser before every product but the one the recipe keeps in float
        assert ops.count("FakeQuantize") >= ops.count("MatMul") - 1 > 0 and len(int8) >= 4 * 2, (ops.count("FakeQuantize"), ops.count("MatMul"), len(int8))


def _weight_types(converted) -> dict[str, str]:
    """Each MatMul with a constant operand: the element type of that constant (int8 behind NNCF's dequantisation)."""
    from taser.models.openvino_backend import matmul_weight_constants

    return {op.get_friendly_name(): constant.get_output_element_type(0).get_type_name() for op, constant in matmul_weight_constants(converted)}


def test_int8_leaves_the_first_blocks_ffn_output_product_in_float_and_only_it(checkpoints):
    import openvino as ov

    from taser.models.openvino_backend import FLOAT_MATMULS

    for name in ("dpr", "taser"):
        path = checkpoints(name)
        load_checkpoint(path, "cpu", backend="openvino_int8")
        for side in ("question", "passage"):
            types = _weight_types(ov.Core().read_model(str(path / CACHE_DIR / "openvino_int8" / f"{side}.xml")))
            kept = sorted(n for n, t in types.items() if t not in ("i8", "u8"))
            assert len(kept) == 1 and FLOAT_MATMULS.search(kept[0]) and ".layer.0." in kept[0], (name, side, kept)
            assert len(types) > 6, types  # every other product of the blocks reads int8 weights


def test_int8_refuses_a_model_without_the_product_its_recipe_keeps_in_float(checkpoints):
    import re

    import openvino as ov

    from taser.models.openvino_backend import float_matmuls

    path = checkpoints("dpr")
    load_checkpoint(path, "cpu", backend="openvino")
    converted = ov.Core().read_model(str(path / CACHE_DIR / "openvino" / "question.xml"))
    assert len(float_matmuls(converted)) == 1
    with pytest.raises(ValueError, match="keeps the matrix products matching 'no-such-block' in float.*none: its first ones are"):
        float_matmuls(converted, re.compile("no-such-block"))


def test_int8_hands_nncf_its_recipe_and_a_change_of_recipe_needs_a_new_version(checkpoints, monkeypatch):
    import nncf
    import openvino as ov

    from taser.models.onnx_backend import calibration_feeds
    from taser.models.openvino_backend import FLOAT_MATMULS, SMOOTH_QUANT_ALPHA, quantize_int8

    # the cache of `openvino_int8` records its recipe's version only: other settings under the same version would reuse
    # models made by the old ones. Change these two and RECIPES' version together.
    assert (SMOOTH_QUANT_ALPHA, FLOAT_MATMULS.pattern, backends.RECIPES[backends.Backend.openvino_int8][1]) == (
        0.75, r"\.encoder\.layer\.0\.output\.(?:experts\.\d+\.output\.)?dense/", 2)
    # a bf16 variant runs its sibling's models: the same version, so a new recipe of the sibling is a new one of the variant
    assert {b: backends.RECIPES[backends.Backend(b)][1] for b in BF16} == {b: backends.RECIPES[backends.Backend(backends.CONVERTED_AS[b])][1] for b in BF16}
    path = checkpoints("dpr")
    model, tokenizer = load_checkpoint(path, "cpu", backend="openvino")
    converted = ov.Core().read_model(str(path / CACHE_DIR / "openvino" / "question.xml"))
    seen = {}
    monkeypatch.setattr(nncf, "quantize", lambda model, dataset, **kw: seen.update(kw) or model)
    quantize_int8(converted, calibration_feeds(tokenizer, model.config, "question"))
    assert seen["model_type"] == nncf.ModelType.TRANSFORMER
    assert seen["advanced_parameters"].smooth_quant_alphas.matmul == SMOOTH_QUANT_ALPHA
    assert [n for n in seen["ignored_scope"].names] == [n for n in (op.get_friendly_name() for op in converted.get_ordered_ops())
                                                          if ".layer.0.output.dense/" in n and n.endswith("MatMul")]  # fmt: skip


def test_missing_package_is_refused_with_the_extra_to_install(monkeypatch):
    import sys

    for name in ("openvino", "nncf"):
        monkeypatch.setitem(sys.modules, name, None)  # an import of it now fails, as where it is not installed
    for backend in backends.OPENVINO_BACKENDS:
        assert not backends.installed(backends.Backend(backend))
        with pytest.raises(ValueError, match=r"backend=openvino\S* needs the optional extra: pip install 'taser-retrieval\[openvino\]'"):
            backends.resolve_backend(backend, "cpu")
    monkeypatch.delitem(sys.modules, "openvino")
    assert backends.installed(backends.Backend.openvino) and backends.installed(backends.Backend.openvino_bf16)
    assert not any(backends.installed(backends.Backend(b)) for b in ("openvino_int8", "openvino_int8_bf16"))  # int8 needs nncf


@needs_bf16
def test_evaluate_records_the_openvino_backend_and_its_own_precision(checkpoints, mini_squad, tmp_path):
    """The backend reaches encoding through evaluate (passages and questions): results.json and the
    index say which backend ran and in what precision (bf16 here, whatever `precision` says)."""
    from taser.pipeline.evaluate import RetrieverSettings, evaluate_qa

    settings = RetrieverSettings("dense", checkpoints("dpr"), None, batch_size=16, precision="fp32", device="cpu", backend="openvino_bf16")
    result = evaluate_qa(settings, mini_squad / "dev.qa.tsv", mini_squad / "passages.tsv", tmp_path / "eval", k=20)
    index = json.loads((tmp_path / "eval" / "dense-index" / "index" / "index.json").read_text())
    assert result["backend"] == "openvino_bf16" and result["precision"] == "bf16"
    assert (index["backend"], index["backend_recipe"], index["precision"]) == ("openvino_bf16", 1, "bf16")


def test_the_profile_benchmark_times_one_batch_and_shares_it_by_operation(checkpoints):
    """benchmarks/peers/profile_openvino.py's measurement, on a tiny model's cached passage model."""
    import importlib.util
    import sys

    from conftest import ROOT

    spec = importlib.util.spec_from_file_location("profile_openvino", ROOT / "benchmarks" / "peers" / "profile_openvino.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    path = checkpoints("dpr")
    load_checkpoint(path, "cpu", backend="openvino")  # converts and caches
    ids = np.array([[101, 2054, 2003, 102, 0], [101, 2054, 2003, 2009, 102]], dtype=np.int64)
    measured = module.profile(path / CACHE_DIR / "openvino" / "passage.xml", "f32", ids, (ids > 0).astype(np.int64), rounds=2)
    assert measured["precision"] == "f32" and measured["ms"] > 0
    assert abs(sum(measured["shares"].values()) - 1) < 1e-6 and "FullyConnected" in measured["shares"]
