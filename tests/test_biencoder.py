"""The bi-encoder: save/load, pooling defaults, dropout settings, checkpoint errors, precision."""

import numpy as np
import pytest
import torch
from conftest import tiny_model_cfg

from taser.data.passages import Passage
from taser.models.biencoder import BiEncoder
from taser.models.encoding import encode_passages
from taser.models.inputs import tokenize_passages, tokenize_questions
from taser.models.loading import load_model


@pytest.mark.parametrize("model_type", ["dpr", "shared"])
def test_save_load_round_trip(tmp_path, tiny_pretrained, tokenizer, model_type):
    model, _ = load_model(tiny_model_cfg(tiny_pretrained, model_type))
    torch.manual_seed(1)
    for p in model.parameters():  # make the two dpr encoders differ
        p.data.add_(torch.randn_like(p) * 0.01)
    model.save(tmp_path / "ckpt", tokenizer)
    loaded = BiEncoder.load(tmp_path / "ckpt")
    assert loaded.config == model.config
    model.eval(), loaded.eval()
    q = tokenize_questions(tokenizer, ["who wrote hamlet?"], 32)
    p = tokenize_passages(tokenizer, ["Hamlet"], ["Hamlet is a tragedy by William Shakespeare."], 64)
    with torch.no_grad():
        a, b = model(q, p), loaded(q, p)
        torch.testing.assert_close(a.questions, b.questions, rtol=0, atol=0)
        torch.testing.assert_close(a.passages, b.passages, rtol=0, atol=0)
        if model_type == "dpr":
            assert not torch.equal(model.encode(**q, side="question"), model.encode(**q, side="passage"))


def test_pooling_defaults_follow_the_checkpoint(tiny_pretrained):
    minilm = BiEncoder.from_pretrained("shipped:all-MiniLM-L6-v2", "shared")
    assert (minilm.config.pooling, minilm.config.normalize) == ("mean", True)
    bert = BiEncoder.from_pretrained(tiny_pretrained, "shared")
    assert (bert.config.pooling, bert.config.normalize) == ("cls", False)  # DPR's for plain BERT checkpoints
    forced = BiEncoder.from_pretrained("shipped:all-MiniLM-L6-v2", "shared", pooling="cls", normalize=False)
    assert (forced.config.pooling, forced.config.normalize) == ("cls", False)


def test_dropout_settings_are_applied_and_saved(tmp_path, tiny_pretrained, tokenizer):
    model, _ = load_model(tiny_model_cfg(tiny_pretrained, "dpr", dropout=0.2, attention_dropout=0.0))
    rates = {name: m.p for name, m in model.named_modules() if isinstance(m, torch.nn.Dropout)}
    assert {p for n, p in rates.items() if n.endswith("self.dropout")} == {0.0}
    assert {p for n, p in rates.items() if not n.endswith("self.dropout")} == {0.2}
    model.save(tmp_path / "ckpt", tokenizer)
    loaded = BiEncoder.load(tmp_path / "ckpt")
    assert {name: m.p for name, m in loaded.named_modules() if isinstance(m, torch.nn.Dropout)} == rates
    # overrides apply when continuing from a checkpoint too
    continued, _ = load_model({"model_type": "dpr", "dropout": 0.3, "init_checkpoint": str(tmp_path / "ckpt")})
    assert {m.p for m in continued.modules() if isinstance(m, torch.nn.Dropout)} == {0.3}


def test_checkpoint_errors(tmp_path, tiny_pretrained, tokenizer):
    model, _ = load_model(tiny_model_cfg(tiny_pretrained, "shared"))
    model.save(tmp_path / "ckpt", tokenizer)
    with pytest.raises(ValueError, match="holds a 'shared' model, but model_type 'dpr' was asked for"):
        BiEncoder.load(tmp_path / "ckpt", expected_type="dpr")
    with pytest.raises(ValueError, match="not a taser bi-encoder checkpoint"):
        BiEncoder.load(tiny_pretrained)
    with pytest.raises(FileNotFoundError, match="no config.json"):
        BiEncoder.load(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="model path not found"):
        load_model({"pretrained": "./no/such/dir"})
    assert isinstance(load_model({"model_type": "shared", "init_checkpoint": str(tmp_path / "ckpt")})[0], BiEncoder)


def test_load_model_from_checkpoint(tmp_path, tiny_pretrained, tokenizer):
    model, _ = load_model(tiny_model_cfg(tiny_pretrained, "shared"))
    model.save(tmp_path / "ckpt", tokenizer)
    # the attention implementation reaches a checkpoint's encoders too
    loaded, _ = load_model({"model_type": "shared", "init_checkpoint": str(tmp_path / "ckpt"), "attention": "eager"})
    assert loaded.question_encoder.config._attn_implementation == "eager"
    # a checkpoint without its weights is an error about them, not a fall-back to from_pretrained
    (tmp_path / "ckpt" / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        load_model({"model_type": "shared", "init_checkpoint": str(tmp_path / "ckpt")})
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        BiEncoder.load(tmp_path / "ckpt")


def test_failed_save_keeps_the_previous_checkpoint(tmp_path, tiny_pretrained, tokenizer):
    model, _ = load_model(tiny_model_cfg(tiny_pretrained, "shared"))
    model.save(tmp_path / "ckpt", tokenizer)
    before = (tmp_path / "ckpt" / "model.safetensors").read_bytes()

    class Broken:
        def save_pretrained(self, _):
            raise OSError("disk full")

    with pytest.raises(OSError):
        model.save(tmp_path / "ckpt", Broken())
    assert (tmp_path / "ckpt" / "model.safetensors").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_bf16_and_fp32_encoders_agree(tiny_pretrained, tokenizer):
    """bf16 autocast vectors stay within cosine 0.99 of fp32. A tiny model: on CPUs without native
    bf16 torch emulates it, and the real MiniLM would take minutes there."""
    model, _ = load_model(tiny_model_cfg(tiny_pretrained, "shared"))
    passages = [
        Passage(str(i), f"Passage {i} about topic {t}: " + " ".join([t] * (5 + i)), t)
        for i, t in enumerate(["rivers", "music", "physics", "football", "cooking", "chess"] * 3)
    ]
    fp32 = encode_passages(model, tokenizer, passages, precision="fp32")
    bf16 = encode_passages(model, tokenizer, passages, precision="bf16")
    cosine = (fp32 * bf16).sum(1) / np.linalg.norm(fp32, axis=1) / np.linalg.norm(bf16, axis=1)
    assert cosine.min() > 0.99
    assert np.abs(fp32 - bf16).max() < 0.05 * np.abs(fp32).max()
    assert not np.array_equal(fp32, bf16)  # bf16 did run


def test_pretrained_names_and_paths(tmp_path):
    from taser.models.pretrained import resolve_pretrained

    assert resolve_pretrained("bert-base-uncased") == "bert-base-uncased"
    assert resolve_pretrained("facebook/dpr-question_encoder-single-nq-base") == "facebook/dpr-question_encoder-single-nq-base"
    assert resolve_pretrained(str(tmp_path)) == str(tmp_path)
    for missing in ("/no/such/model", "./model", "~/model", "a/b/c"):
        with pytest.raises(FileNotFoundError, match="model path not found"):
            resolve_pretrained(missing)


@pytest.mark.parametrize("saved_dtype", [torch.bfloat16, torch.float16])
def test_weights_load_as_float32_whatever_they_were_saved_in(tmp_path, tiny_pretrained, tokenizer, saved_dtype):
    """Would catch transformers' dtype="auto" keeping a half-precision checkpoint's dtype: bf16
    master weights lose AdamW's small updates to rounding, and fp16 ones fail in GradScaler."""
    from transformers import BertModel

    half = tmp_path / "half-pretrained"
    BertModel.from_pretrained(tiny_pretrained).to(saved_dtype).save_pretrained(half)
    tokenizer.save_pretrained(half)
    taser = {"taser": {"specialize_every": 1}}
    model, _ = load_model(tiny_model_cfg(str(half), "taser", **taser))
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    model.to(saved_dtype).save(tmp_path / "half-ckpt", tokenizer)  # a taser checkpoint saved in half precision
    assert {p.dtype for p in BiEncoder.load(tmp_path / "half-ckpt").parameters()} == {torch.float32}
    continued, _ = load_model({**tiny_model_cfg(str(half), "taser", **taser), "init_checkpoint": str(tmp_path / "half-ckpt"), "pretrained": None})
    assert {p.dtype for p in continued.parameters()} == {torch.float32}


def test_padding_free_is_the_default_on_cpus_only(tiny_pretrained, monkeypatch):
    """Would catch the unmeasured padding-free path (masked attention groups, host syncs) turning
    on by default on GPUs; `unpad=True` still asks for it anywhere."""
    import taser.models.biencoder as biencoder

    model, _ = load_model(tiny_model_cfg(tiny_pretrained, "shared"))
    encoder = model.encoder_for("passage")
    assert biencoder.unpad_by_default(torch.device("cpu")) and not biencoder.unpad_by_default(torch.device("cuda", 0))
    assert model.runs_unpadded(encoder)
    monkeypatch.setattr(biencoder, "unpad_by_default", lambda device: False)  # as on a GPU
    assert not model.runs_unpadded(encoder)
    model.unpad = True
    assert model.runs_unpadded(encoder)
