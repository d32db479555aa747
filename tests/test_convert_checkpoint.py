"""Checkpoint import and export, proven on tiny random models in each foreign layout, without
downloads: the imported model gives the foreign model's vectors (to float32 rounding), import ->
export -> import loses nothing, and each kind of bad input is refused naming the file and the
tensors or settings at fault, with nothing written.

- Hugging Face DPR: transformers' own `DPRQuestionEncoder` / `DPRContextEncoder`;
- DPR's `.cp`: a `model_dict` built from those encoders' BERT weights (plus a pooler);
- TASER's release: a state dict with TASER's tensor names (microsoft/taser `moe_models.py`,
  `mod3:fwd`, two experts, one shared encoder), against a reference forward pass written here from
  the papers' equations, independent of transformers and of this library; an export is checked
  against what TASER's loader reads (the flat `encoder_params`, `encoder_model_type: hf_any`), not
  against this library's reader only.

Reference inputs are built as DPR and TASER build them (`dpr_inputs`: a titled passage is the pair
`tokenizer.encode(title, text_pair=text, truncation=True)` of their slow tokenizer, written out in
`dpr_reference`; token type ids all zero), not with this library's tokenisation.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import ROOT, tiny_bert_config, tiny_model_cfg
from dpr_reference import dpr_ids
from safetensors.torch import load_file, save_file

from taser.data.passages import Passage
from taser.models.convert.mapping import ConversionError
from taser.models.convert.taser_release import export_taser_release
from taser.models.encoding import encode_passages, encode_questions
from taser.models.inputs import passage_string
from taser.models.loading import load_checkpoint, load_model
from taser.pipeline.convert import convert_checkpoint

QUESTIONS = ["who wrote the origin of species?", "when did the first world war end", "capital of france"]
PASSAGES = [("Charles Darwin", "On the Origin of Species, published on 24 November 1859, is a work of scientific literature by Charles Darwin."),
            ("Armistice", "The armistice of 11 November 1918 ended fighting on land, sea and air in World War I."),
            ("", "Paris")]  # fmt: skip
TOL = {"atol": 2e-5, "rtol": 1e-4}  # float32 rounding: different kernels, batch orders and padding


def passage_strings(tokenizer) -> list[str]:
    """The passages as one string each, as a sentence-transformers export reads them."""
    return [passage_string(title, text, tokenizer.sep_token) for title, text in PASSAGES]


def dpr_inputs(tokenizer, side: str, passages=PASSAGES, max_length: int = 512):
    """(input_ids, attention_mask) as DPR's and TASER's `text_to_tensor` build them: a question
    alone, a titled passage as the pair (title, text) truncated longest-first by their slow
    tokenizer's rule (`dpr_reference`), an untitled one alone; padded right. (Token type ids: all zero, the encoders' default.)"""
    if side == "question":
        rows = [tokenizer.encode(q, truncation=True, max_length=max_length) for q in QUESTIONS]
    else:
        rows = [dpr_ids(tokenizer, title, text, max_length) for title, text in passages]
    longest = max(map(len, rows))
    ids = torch.tensor([row + [tokenizer.pad_token_id] * (longest - len(row)) for row in rows])
    mask = torch.tensor([[1] * len(row) + [0] * (longest - len(row)) for row in rows])
    return ids, mask


def our_vectors(checkpoint, side: str, passages=PASSAGES) -> torch.Tensor:
    """A checkpoint's vectors as the stages compute them: `load_checkpoint`, then `encode_questions`
    or `encode_passages`."""
    model, tokenizer = load_checkpoint(checkpoint, device="cpu")
    kwargs = {"batch_size": 2, "precision": "fp32"}
    if side == "question":
        return torch.from_numpy(encode_questions(model, tokenizer, QUESTIONS, **kwargs))
    items = [Passage(str(i), text, title) for i, (title, text) in enumerate(passages)]
    return torch.from_numpy(encode_passages(model, tokenizer, items, **kwargs))


def perturb(module: torch.nn.Module, seed: int) -> None:
    """Move every weight off its initial value (LayerNorm 1/0 included), so a misplaced tensor shows."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=generator))


def refused(call, output, match: str, *args, **kwargs) -> str:
    """The ConversionError of `call`, which must have written nothing."""
    with pytest.raises(ConversionError, match=match) as info:
        call(*args, **kwargs)
    assert not output.exists(), "a refused conversion wrote its output"
    assert not [p for p in output.parent.iterdir() if p.name.startswith(f".{output.name}.")], "temporary files left behind"
    return str(info.value)


def same_state(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


# -- Hugging Face DPR -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def dpr_pair(tmp_path_factory, tokenizer):
    """transformers' DPR encoders with tiny random weights, saved as two model directories."""
    from transformers import DPRConfig, DPRContextEncoder, DPRQuestionEncoder

    config = DPRConfig(vocab_size=tokenizer.vocab_size, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
    root = tmp_path_factory.mktemp("hf-dpr")
    models = {}
    for seed, (name, cls) in enumerate((("question", DPRQuestionEncoder), ("ctx", DPRContextEncoder))):
        torch.manual_seed(seed)
        model = cls(config).eval()
        perturb(model, seed)
        model.save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
        models[name] = model
    return root / "question", root / "ctx", models


def dpr_vectors(dpr_pair, tokenizer, side: str, passages=PASSAGES, max_length: int = 512) -> torch.Tensor:
    """transformers' DPR encoders on DPR's inputs, token type ids zero as DPR passes them."""
    _, _, models = dpr_pair
    ids, mask = dpr_inputs(tokenizer, side, passages, max_length)
    with torch.no_grad():
        model = models["question" if side == "question" else "ctx"]
        return model(input_ids=ids, attention_mask=mask, token_type_ids=torch.zeros_like(ids)).pooler_output


def test_hf_dpr_import_gives_dprs_vectors(dpr_pair, tokenizer, tmp_path):
    question_dir, ctx_dir, _ = dpr_pair
    out = convert_checkpoint("import_hf_dpr", question_dir, tmp_path / "dpr", ctx_source=ctx_dir)
    config = json.loads((out / "config.json").read_text())["taser"]
    assert (config["model_type"], config["pooling"], config["normalize"], config["similarity"]) == ("dpr", "cls", False, "dot")
    for side in ("question", "passage"):
        torch.testing.assert_close(our_vectors(out, side), dpr_vectors(dpr_pair, tokenizer, side), **TOL)


def test_hf_dpr_round_trip_is_lossless_and_transformers_loads_the_export(dpr_pair, tokenizer, tmp_path):
    from transformers import DPRContextEncoder, DPRQuestionEncoder

    question_dir, ctx_dir, _ = dpr_pair
    first = convert_checkpoint("import_hf_dpr", question_dir, tmp_path / "first", ctx_source=ctx_dir)
    exported = convert_checkpoint("export_hf_dpr", first, tmp_path / "hf")
    second = convert_checkpoint("import_hf_dpr", exported / "question_encoder", tmp_path / "second", ctx_source=exported / "ctx_encoder")
    same_state(load_file(first / "model.safetensors"), load_file(second / "model.safetensors"))
    configs = [json.loads((c / "config.json").read_text()) for c in (first, second)]
    for config in configs:
        config["taser"].pop("pretrained")  # where it came from
    assert configs[0] == configs[1]
    # transformers' own classes load the export and give the original vectors
    for side, cls, sub in (("question", DPRQuestionEncoder, "question_encoder"), ("passage", DPRContextEncoder, "ctx_encoder")):
        loaded = cls.from_pretrained(exported / sub).eval()
        ids, mask = dpr_inputs(tokenizer, side)
        with torch.no_grad():
            vectors = loaded(input_ids=ids, attention_mask=mask, token_type_ids=torch.zeros_like(ids)).pooler_output
        torch.testing.assert_close(vectors, dpr_vectors(dpr_pair, tokenizer, side), **TOL)
    readme = (exported / "README.md").read_text()
    assert "\u2019" in readme and "token_type_ids all zero" in readme and "longest_first" in readme


def copy_dir(src, dst):
    shutil.copytree(src, dst)
    return dst


def edit_weights(directory, edit) -> None:
    state = load_file(directory / "model.safetensors")
    edit(state)
    save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})


def test_hf_dpr_files_of_older_transformers_import(dpr_pair, tokenizer, tmp_path):
    """Files written by transformers 3/4 also hold the BERT pooler and the position_ids buffer."""
    question_dir, ctx_dir, _ = dpr_pair
    older = {}
    for name, directory, prefix in (("question", question_dir, "question_encoder"), ("ctx", ctx_dir, "ctx_encoder")):
        older[name] = copy_dir(directory, tmp_path / name)
        extra = {f"{prefix}.bert_model.pooler.dense.weight": torch.randn(64, 64), f"{prefix}.bert_model.pooler.dense.bias": torch.randn(64)}
        extra[f"{prefix}.bert_model.embeddings.position_ids"] = torch.arange(512)[None]
        edit_weights(older[name], lambda state, extra=extra: state.update(extra))
    out = convert_checkpoint("import_hf_dpr", older["question"], tmp_path / "dpr", ctx_source=older["ctx"])
    pooler = load_file(older["question"] / "model.safetensors")["question_encoder.bert_model.pooler.dense.weight"]
    assert torch.equal(load_file(out / "model.safetensors")["question_encoder.pooler.dense.weight"], pooler)
    torch.testing.assert_close(our_vectors(out, "question"), dpr_vectors(dpr_pair, tokenizer, "question"), **TOL)


def test_hf_dpr_refusals(dpr_pair, tiny_pretrained, tmp_path):
    question_dir, ctx_dir, _ = dpr_pair
    out = tmp_path / "out"
    name = "question_encoder.bert_model.encoder.layer.1.output.dense.weight"

    missing = copy_dir(question_dir, tmp_path / "missing")
    edit_weights(missing, lambda s: s.pop(name))
    text = refused(convert_checkpoint, out, "1 missing", "import_hf_dpr", missing, out, ctx_source=ctx_dir)
    assert name in text and str(missing / "model.safetensors") in text

    extra = copy_dir(question_dir, tmp_path / "extra")
    edit_weights(extra, lambda s: s.update({name.replace("layer.1", "layer.2"): s[name].clone()}))
    assert "layer.2.output.dense.weight" in refused(convert_checkpoint, out, "1 unexpected", "import_hf_dpr", extra, out, ctx_source=ctx_dir)

    # the directories swapped: the names say so
    text = refused(convert_checkpoint, out, "missing", "import_hf_dpr", ctx_dir, out, ctx_source=question_dir)
    assert "ctx_encoder.bert_model" in text and "its tensors start with ctx_encoder." in text

    projected = copy_dir(question_dir, tmp_path / "projected")
    config = json.loads((projected / "config.json").read_text())
    (projected / "config.json").write_text(json.dumps(config | {"projection_dim": 32}))
    refused(convert_checkpoint, out, "projection_dim=32.*encode_proj", "import_hf_dpr", projected, out, ctx_source=ctx_dir)

    wider = copy_dir(question_dir, tmp_path / "wider")
    (wider / "config.json").write_text(json.dumps(config | {"intermediate_size": 256}))
    refused(convert_checkpoint, out, r"differ in intermediate_size \(256 vs 128\)", "import_hf_dpr", wider, out, ctx_source=ctx_dir)

    refused(convert_checkpoint, out, "model_type 'bert', not a DPR encoder", "import_hf_dpr", tiny_pretrained, out, ctx_source=ctx_dir)
    with pytest.raises(FileNotFoundError, match="no-such"):
        convert_checkpoint("import_hf_dpr", tmp_path / "no-such", out, ctx_source=ctx_dir)


# -- DPR's own .cp --------------------------------------------------------------------------
def dpr_cp_state(dpr_pair, encoder_params) -> dict:
    """DPR's checkpoint dict with the pair's BERT weights as `question_model.*` / `ctx_model.*`."""
    _, _, models = dpr_pair
    model_dict = {}
    for side, model, sub in (("question_model", models["question"], "question_encoder"), ("ctx_model", models["ctx"], "ctx_encoder")):
        bert = getattr(model, sub).bert_model
        model_dict.update({f"{side}.{k}": v.clone() for k, v in bert.state_dict().items()})
        model_dict[f"{side}.embeddings.position_ids"] = torch.arange(512).unsqueeze(0)  # as older transformers saved it
        width = bert.config.hidden_size  # DPR's HFBertEncoder is a BertModel, pooler included
        model_dict[f"{side}.pooler.dense.weight"] = torch.randn(width, width)
        model_dict[f"{side}.pooler.dense.bias"] = torch.randn(width)
    return {
        "model_dict": model_dict,
        "optimizer_dict": {"state": {}, "param_groups": [{"lr": 2e-5, "params": []}]},
        "scheduler_dict": {"last_epoch": 100},
        "offset": 0,
        "epoch": 39,
        "encoder_params": encoder_params,
    }


def test_dpr_cp_import_gives_dprs_vectors_and_keeps_the_pooler(dpr_pair, tokenizer, tiny_pretrained, tmp_path):
    params = {"do_lower_case": True, "pretrained_model_cfg": tiny_pretrained, "encoder_model_type": "hf_bert", "pretrained_file": None,
              "projection_dim": 0, "sequence_length": 48}  # fmt: skip  # DPR's first release: flat encoder_params
    state = dpr_cp_state(dpr_pair, params)
    torch.save(state, tmp_path / "dpr_biencoder.cp")
    out = convert_checkpoint("import_dpr_cp", tmp_path / "dpr_biencoder.cp", tmp_path / "dpr")
    config = json.loads((out / "config.json").read_text())["taser"]
    assert config["max_length"] == config["max_question_length"] == 48 and config["model_type"] == "dpr"
    for side in ("question", "passage"):
        torch.testing.assert_close(our_vectors(out, side), dpr_vectors(dpr_pair, tokenizer, side), **TOL)
    saved = load_file(out / "model.safetensors")
    assert torch.equal(saved["passage_encoder.pooler.dense.weight"], state["model_dict"]["ctx_model.pooler.dense.weight"])
    # -> the Hugging Face pair (which has no pooler) -> back: the same vectors
    exported = convert_checkpoint("export_hf_dpr", out, tmp_path / "hf")
    again = convert_checkpoint("import_hf_dpr", exported / "question_encoder", tmp_path / "again", ctx_source=exported / "ctx_encoder")
    for side in ("question", "passage"):
        torch.testing.assert_close(our_vectors(again, side), dpr_vectors(dpr_pair, tokenizer, side), **TOL)


def test_dpr_cp_with_hydra_settings_needs_allow_pickle(dpr_pair, tokenizer, tiny_pretrained, tmp_path):
    from omegaconf import OmegaConf

    encoder = OmegaConf.create({"encoder_model_type": "hf_bert", "pretrained_model_cfg": tiny_pretrained, "projection_dim": 0, "sequence_length": 40,
                                "dropout": 0.1, "pretrained": True})  # fmt: skip
    torch.save(dpr_cp_state(dpr_pair, {"do_lower_case": True, "encoder": encoder}), tmp_path / "hydra.cp")
    out = tmp_path / "dpr"
    text = refused(convert_checkpoint, out, "allow_pickle=true", "import_dpr_cp", tmp_path / "hydra.cp", out)
    assert str(tmp_path / "hydra.cp") in text and "DictConfig" in text
    convert_checkpoint("import_dpr_cp", tmp_path / "hydra.cp", out, allow_pickle=True)
    assert json.loads((out / "config.json").read_text())["taser"]["max_length"] == 40
    torch.testing.assert_close(our_vectors(out, "question"), dpr_vectors(dpr_pair, tokenizer, "question"), **TOL)


def test_dpr_cp_refusals(dpr_pair, tiny_pretrained, tokenizer, tmp_path):
    out = tmp_path / "out"
    params = {"do_lower_case": True, "pretrained_model_cfg": tiny_pretrained, "projection_dim": 0, "sequence_length": 64}

    state = dpr_cp_state(dpr_pair, params)
    state["model_dict"]["question_model.encode_proj.weight"] = torch.zeros(8, 64)
    torch.save(state, tmp_path / "proj.cp")
    refused(convert_checkpoint, out, "project their .CLS. vectors.*question_model.encode_proj.weight", "import_dpr_cp", tmp_path / "proj.cp", out)

    torch.save(dpr_cp_state(dpr_pair, {}), tmp_path / "anonymous.cp")
    refused(convert_checkpoint, out, "does not record the model it was trained from.*base_model=", "import_dpr_cp", tmp_path / "anonymous.cp", out)

    # another base model: the shapes do not match, and the message says which
    other = tmp_path / "wide-bert"
    wide = tiny_bert_config(tokenizer.vocab_size)
    wide.intermediate_size = 96
    wide.save_pretrained(other)
    tokenizer.save_pretrained(other)
    torch.save(dpr_cp_state(dpr_pair, params), tmp_path / "dpr.cp")
    text = refused(convert_checkpoint, out, "12 of another shape", "import_dpr_cp", tmp_path / "dpr.cp", out, base_model=str(other))
    assert "question_model.encoder.layer.0.intermediate.dense.weight (128, 64) (model: (96, 64))" in text

    (tmp_path / "garbage.cp").write_bytes(b"not a checkpoint" * 8)
    refused(convert_checkpoint, out, "garbage.cp is not a PyTorch", "import_dpr_cp", tmp_path / "garbage.cp", out)
    torch.save({"model_dict": {"question_model.x": "text"}}, tmp_path / "strings.cp")
    refused(convert_checkpoint, out, "model_dict is not a mapping of names to tensors", "import_dpr_cp", tmp_path / "strings.cp", out)


# -- import settings: max_length, a missing pooler --------------------------------------------
LONG = [("Charles Darwin and the Voyage of the Beagle " * 4, "On the Origin of Species, published in 1859, is a work of scientific literature. " * 4),
        ("", "The armistice of 11 November 1918 ended fighting on land, sea and air in World War I. " * 4)]  # fmt: skip


def test_max_length_on_import_is_honoured(dpr_pair, tokenizer, taser_release, tiny_pretrained, tmp_path):
    """`max_length=` replaces DPR's 256 and a file's sequence_length, in the config and in what is
    read: a passage longer than it gives DPR's vectors of its pair encoding truncated to it."""
    question_dir, ctx_dir, _ = dpr_pair
    out = convert_checkpoint("import_hf_dpr", question_dir, tmp_path / "hf", ctx_source=ctx_dir, max_length=24)
    config = json.loads((out / "config.json").read_text())["taser"]
    assert config["max_length"] == config["max_question_length"] == 24
    assert dpr_inputs(tokenizer, "passage", LONG)[0].shape[1] > 24  # the passages are longer than that
    torch.testing.assert_close(our_vectors(out, "passage", LONG), dpr_vectors(dpr_pair, tokenizer, "passage", LONG, max_length=24), **TOL)

    params = {"do_lower_case": True, "pretrained_model_cfg": tiny_pretrained, "projection_dim": 0, "sequence_length": 48}
    torch.save(dpr_cp_state(dpr_pair, params), tmp_path / "dpr.cp")
    out = convert_checkpoint("import_dpr_cp", tmp_path / "dpr.cp", tmp_path / "cp", max_length=32)  # the file says 48
    config = json.loads((out / "config.json").read_text())["taser"]
    assert config["max_length"] == config["max_question_length"] == 32
    torch.testing.assert_close(our_vectors(out, "passage", LONG), dpr_vectors(dpr_pair, tokenizer, "passage", LONG, max_length=32), **TOL)

    directory, model_dict = taser_release
    out = convert_checkpoint("import_taser", directory, tmp_path / "taser", max_length=40)  # the file says 64
    config = json.loads((out / "config.json").read_text())["taser"]
    assert config["max_length"] == config["max_question_length"] == 40
    reference = reference_vectors(model_dict, *dpr_inputs(tokenizer, "passage", LONG, max_length=40), expert=1)
    torch.testing.assert_close(our_vectors(out, "passage", LONG), reference, **TOL)


def test_a_missing_pooler_is_imported_as_zeros(dpr_pair, tokenizer, taser_release, taser_base, tmp_path, caplog):
    """BERT's pooler feeds no vector: a file without it (transformers' DPR never has one) imports
    with the pooler set to zero, said in the log, and the vectors are the file's."""
    caplog.set_level(logging.INFO, logger="taser.models.convert.target")
    question_dir, ctx_dir, _ = dpr_pair
    out = convert_checkpoint("import_hf_dpr", question_dir, tmp_path / "hf", ctx_source=ctx_dir)
    saved = load_file(out / "model.safetensors")
    poolers = sorted(n for n in saved if ".pooler." in n)
    assert poolers == [f"{side}.pooler.dense.{kind}" for side in ("passage_encoder", "question_encoder") for kind in ("bias", "weight")]
    assert all(not saved[n].any() for n in poolers)
    assert "4 pooler tensors set to zero" in caplog.text
    torch.testing.assert_close(our_vectors(out, "passage"), dpr_vectors(dpr_pair, tokenizer, "passage"), **TOL)

    caplog.clear()
    directory, model_dict = taser_release
    bare = {k: v for k, v in model_dict.items() if ".pooler." not in k}
    save_release(tmp_path / "bare", bare, TASER_RELEASE_PARAMS | {"pretrained_model_cfg": taser_base})
    out = convert_checkpoint("import_taser", tmp_path / "bare", tmp_path / "taser")
    saved = load_file(out / "model.safetensors")
    assert [n for n in saved if ".pooler." in n] and all(not saved[n].any() for n in saved if ".pooler." in n)
    assert "2 pooler tensors set to zero" in caplog.text
    torch.testing.assert_close(our_vectors(out, "passage"), reference_vectors(model_dict, *dpr_inputs(tokenizer, "passage"), expert=1), **TOL)


# -- TASER's release ------------------------------------------------------------------------
LAYERS, MOE_BLOCKS, HEADS, WIDTH, FFN = 6, (2, 5), 4, 64, 128  # mod3 on 6 blocks: (i + 1) % 3 == 0


def taser_model_dict(vocab: int, seed: int = 0, experts: int = 2) -> dict[str, torch.Tensor]:
    """TASER's `MoEBertModel` state dict (random), under `question_model.encoder.` and again under
    `ctx_model.encoder.`, as TASER's shared-encoder `MoEBiEncoder.state_dict()` holds it."""
    generator = torch.Generator().manual_seed(seed)
    rand = lambda *shape: 0.2 * torch.randn(*shape, generator=generator)
    sd = {}

    def dense(name, n_out, n_in):
        sd[f"{name}.weight"], sd[f"{name}.bias"] = rand(n_out, n_in), rand(n_out)

    def norm(name):
        sd[f"{name}.weight"], sd[f"{name}.bias"] = 1 + rand(WIDTH), rand(WIDTH)

    sd["embeddings.word_embeddings.weight"] = rand(vocab, WIDTH)
    sd["embeddings.position_embeddings.weight"] = rand(512, WIDTH)
    sd["embeddings.token_type_embeddings.weight"] = rand(2, WIDTH)
    sd["embeddings.position_ids"] = torch.arange(512).unsqueeze(0)
    norm("embeddings.LayerNorm")
    for i in range(LAYERS):
        p = f"encoder.layer.{i}."
        for part in ("query", "key", "value"):
            dense(p + "attention.self." + part, WIDTH, WIDTH)
        dense(p + "attention.output.dense", WIDTH, WIDTH)
        norm(p + "attention.output.LayerNorm")
        ffns = (
            [(f"{p}moe_layer.interm_layers.{e}.", f"{p}moe_layer.output_layers.{e}.") for e in range(experts)]
            if i in MOE_BLOCKS
            else [(p + "intermediate.", p + "output.")]
        )
        for intermediate, output in ffns:
            dense(intermediate + "dense", FFN, WIDTH)
            dense(output + "dense", WIDTH, FFN)
            norm(output + "LayerNorm")
    dense("pooler.dense", WIDTH, WIDTH)
    return {f"{side}_model.encoder.{k}": v for side in ("question", "ctx") for k, v in sd.items()}


def reference_vectors(model_dict, input_ids, attention_mask, expert: int) -> torch.Tensor:
    """The [CLS] vector of TASER's encoder, from the papers' equations on TASER's tensor names.

    BERT (Devlin et al. 2019): embeddings (word + position + segment 0) then LayerNorm; each block
    is multi-head self-attention over the unpadded tokens, output projection, residual LayerNorm,
    then the FFN W2 gelu(W1 x + b1) + b2, residual LayerNorm. TASER (Cheng et al. 2023): in the
    specialised blocks the FFN is the input type's expert (expert 0 questions, 1 passages).
    """
    w = lambda name: model_dict["question_model.encoder." + name]

    def linear(x, name):
        return x @ w(name + ".weight").T + w(name + ".bias")

    def layer_norm(x, name, eps=1e-12):
        mean, var = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True)
        return (x - mean) / torch.sqrt(var + eps) * w(name + ".weight") + w(name + ".bias")

    def gelu(x):
        return 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))

    batch_size, length = input_ids.shape
    head = WIDTH // HEADS
    x = (
        w("embeddings.word_embeddings.weight")[input_ids]
        + w("embeddings.position_embeddings.weight")[:length]
        + w("embeddings.token_type_embeddings.weight")[0]
    )
    x = layer_norm(x, "embeddings.LayerNorm")
    padding = (attention_mask == 0)[:, None, None, :]
    for i in range(LAYERS):
        p = f"encoder.layer.{i}."
        heads = [linear(x, p + "attention.self." + part).view(batch_size, length, HEADS, head).transpose(1, 2) for part in ("query", "key", "value")]
        scores = (heads[0] @ heads[1].transpose(-1, -2) / math.sqrt(head)).masked_fill(padding, float("-inf"))
        attended = (scores.softmax(-1) @ heads[2]).transpose(1, 2).reshape(batch_size, length, WIDTH)
        a = layer_norm(linear(attended, p + "attention.output.dense") + x, p + "attention.output.LayerNorm")
        if i in MOE_BLOCKS:
            intermediate, output = f"{p}moe_layer.interm_layers.{expert}.", f"{p}moe_layer.output_layers.{expert}."
        else:
            intermediate, output = p + "intermediate.", p + "output."
        x = layer_norm(linear(gelu(linear(a, intermediate + "dense")), output + "dense") + a, output + "LayerNorm")
    return x[:, 0]


# What TASER's loader reads from `encoder_params`: six flat keys (DPR's `set_cfg_params_from_state`,
# the version TASER runs; a missing one is a KeyError there). TASER's released file holds these.
TASER_LOADER_KEYS = ("do_lower_case", "pretrained_model_cfg", "encoder_model_type", "pretrained_file", "projection_dim", "sequence_length")
TASER_RELEASE_PARAMS = {"do_lower_case": True, "encoder_model_type": "hf_any", "pretrained_file": None, "projection_dim": 0, "sequence_length": 64}
# The nested layout (a whole Hydra encoder config under "encoder"), as DPR's Hydra-era checkpoints
# and this library's export before it wrote the flat layout hold it: still imported.
TASER_SETTINGS = {
    "encoder_model_type": "hf_bert", "projection_dim": 0, "sequence_length": 64, "dropout": 0.1, "use_moe": True, "moe_type": "mod3:fwd",
    "num_expert": 2, "use_infer_expert": False, "per_layer_gating": False, "shared_encoder": True, "mean_pool": False, "factor_rep": False,
}  # fmt: skip


def taser_loader_reads(state: dict) -> dict:
    """The encoder settings TASER's scripts take from a checkpoint, read as its DPR code reads them:
    `CheckpointState(**state)` (exactly its six fields), then the six flat keys of `encoder_params`
    (a KeyError, as there, when one is missing). Written from that code's description, here so the
    export is checked against the other side's reader, not this library's."""
    assert set(state) == {"model_dict", "optimizer_dict", "scheduler_dict", "offset", "epoch", "encoder_params"}  # CheckpointState(**state)
    params = state["encoder_params"]
    return {key: params[key] for key in TASER_LOADER_KEYS}


@pytest.fixture(scope="module")
def taser_base(tmp_path_factory, tokenizer) -> str:
    """The BERT model TASER was trained from: config (6 blocks) and tokenizer only."""
    path = tmp_path_factory.mktemp("taser-base")
    tiny_bert_config(tokenizer.vocab_size, layers=LAYERS).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def save_release(directory, model_dict, encoder: dict, nested: bool = False) -> None:
    """A TASER checkpoint file: `encoder_params` flat (the release), or nested under "encoder"."""
    directory.mkdir(parents=True, exist_ok=True)
    params = {"do_lower_case": True, "encoder": encoder} if nested else {"do_lower_case": True, **encoder}
    state = {"model_dict": model_dict, "optimizer_dict": None, "scheduler_dict": None, "offset": 0, "epoch": 0, "encoder_params": params}
    torch.save(state, directory / "pytorch_model.bin")


@pytest.fixture(scope="module")
def taser_release(tmp_path_factory, tokenizer, taser_base):
    """TASER's release: flat `encoder_params` with the six keys its loader reads."""
    directory = tmp_path_factory.mktemp("taser-release")
    model_dict = taser_model_dict(tokenizer.vocab_size)
    save_release(directory, model_dict, TASER_RELEASE_PARAMS | {"pretrained_model_cfg": taser_base})
    assert set(taser_loader_reads(torch.load(directory / "pytorch_model.bin", weights_only=True))) == set(TASER_LOADER_KEYS)
    return directory, model_dict


def test_taser_import_gives_the_reference_vectors(taser_release, tokenizer, tmp_path):
    directory, model_dict = taser_release
    out = convert_checkpoint("import_taser", directory, tmp_path / "taser")
    config = json.loads((out / "config.json").read_text())["taser"]
    assert config["model_type"] == "taser" and config["taser"]["specialized_layers"] == list(MOE_BLOCKS)
    assert config["taser"]["routing"] == "deterministic" and config["taser"]["specialize"] == "ffn"
    assert config["max_length"] == config["max_question_length"] == 64  # the file's sequence_length
    with torch.no_grad():
        for side, expert in (("question", 0), ("passage", 1)):
            torch.testing.assert_close(our_vectors(out, side), reference_vectors(model_dict, *dpr_inputs(tokenizer, side), expert), **TOL)
        # the experts matter: the other expert gives other vectors
        other = reference_vectors(model_dict, *dpr_inputs(tokenizer, "passage"), 0)
        assert (other - our_vectors(out, "passage")).abs().max() > 1e-2


def test_taser_files_with_nested_encoder_params_still_import(taser_release, taser_base, tmp_path):
    """The nested layout (this library's export before it wrote TASER's flat one) gives the same model."""
    directory, model_dict = taser_release
    save_release(tmp_path / "nested", model_dict, TASER_SETTINGS | {"pretrained_model_cfg": taser_base}, nested=True)
    flat = convert_checkpoint("import_taser", directory, tmp_path / "flat")
    nested = convert_checkpoint("import_taser", tmp_path / "nested", tmp_path / "from-nested")
    same_state(load_file(flat / "model.safetensors"), load_file(nested / "model.safetensors"))
    configs = [json.loads((c / "config.json").read_text())["taser"] for c in (flat, nested)]
    for config in configs:
        config.pop("pretrained")  # where it came from
    assert configs[0] == configs[1]


def test_taser_export_is_the_layout_tasers_loader_reads(taser_release, taser_base, tokenizer, tmp_path):
    directory, model_dict = taser_release
    first = convert_checkpoint("import_taser", directory / "pytorch_model.bin", tmp_path / "first")
    exported = convert_checkpoint("export_taser", first, tmp_path / "release", base_model="bert-base-uncased")
    state = torch.load(exported / "pytorch_model.bin", weights_only=True)  # plain containers: no pickled objects
    # key by key, what TASER's loader reads: flat, exactly these six, nothing nested
    assert list(state["encoder_params"]) == list(TASER_LOADER_KEYS)
    assert taser_loader_reads(state) == {
        "do_lower_case": True,  # the tokenizer lower-cases
        "pretrained_model_cfg": "bert-base-uncased",  # base_model: TASER builds the encoder and tokenizer from this name
        "encoder_model_type": "hf_any",  # TASER's init_biencoder_components_v2 sends hf_any to its MoE builder (hf_bert: DPR's plain BERT)
        "pretrained_file": None,
        "projection_dim": 0,
        "sequence_length": 64,
    }
    assert (state["optimizer_dict"], state["scheduler_dict"], state["offset"], state["epoch"]) == (None, None, 0, 0)
    # TASER's tensors, by TASER's names, and exactly the release's keys: its pinned transformers (4.12.5) saves the
    # position_ids buffer and its strict load_state_dict requires it ("Missing key(s): encoder.embeddings.position_ids")
    same_state(state["model_dict"], model_dict)
    assert "transformers 4.12.5 (with `embeddings.position_ids`" in (exported / "README.md").read_text()
    # for transformers >= 4.31, which no longer saves the buffer and refuses it as unexpected: the same keys less it
    newer = convert_checkpoint("export_taser", first, tmp_path / "newer", base_model="bert-base-uncased", target_transformers="4.44.2")
    newer_state = torch.load(newer / "pytorch_model.bin", weights_only=True)["model_dict"]
    assert set(newer_state) == {k for k in model_dict if not k.endswith("embeddings.position_ids")}
    assert convert_checkpoint("export_taser", first, tmp_path / "pinned", base_model="bert-base-uncased", target_transformers="4.30")
    assert set(torch.load(tmp_path / "pinned" / "pytorch_model.bin", weights_only=True)["model_dict"]) == set(model_dict)
    with pytest.raises(ValueError, match="target_transformers must be a version"):
        convert_checkpoint("export_taser", first, tmp_path / "bad", base_model="bert-base-uncased", target_transformers="latest")
    with pytest.raises(ValueError, match="target_transformers applies to export_taser"):
        convert_checkpoint("export_hf_dpr", first, tmp_path / "bad", target_transformers="4.44")
    assert "encoder.moe_type=mod3:fwd" in (exported / "README.md").read_text()
    # the export imports back to the same tensors (the base model named in the file is not here: base_model= stands in)
    second = convert_checkpoint("import_taser", exported, tmp_path / "second", base_model=taser_base)
    same_state(load_file(first / "model.safetensors"), load_file(second / "model.safetensors"))
    # base_model is required: it is what TASER's code builds from
    out = tmp_path / "no-base"
    with pytest.raises(ValueError, match="export_taser needs base_model="):
        convert_checkpoint("export_taser", first, out)
    refused(export_taser_release, out, "export_taser needs base_model=", first, out)


def test_taser_refusals(taser_release, taser_base, tokenizer, tmp_path, dpr_pair, tiny_pretrained):
    _, model_dict = taser_release
    out = tmp_path / "out"
    settings = TASER_SETTINGS | {"pretrained_model_cfg": taser_base}

    def release(name, state=model_dict, encoder=settings):  # nested: the settings only that layout records
        save_release(tmp_path / name, state, encoder, nested=True)
        return tmp_path / name

    gates = {f"{side}_model.encoder.encoder.expert_gate.fwd_func.weight": torch.zeros(2, WIDTH) for side in ("question", "ctx")}  # learned routing
    gate = release("gate", model_dict | gates)
    refused(convert_checkpoint, out, "1 unexpected: question_model.encoder.encoder.expert_gate.fwd_func.weight", "import_taser", gate, out)

    learned = release("learned", encoder=settings | {"use_infer_expert": True, "moe_type": "mod3:attn"})
    refused(convert_checkpoint, out, "moe_type='mod3:attn'.*use_infer_expert=True .learned routing.", "import_taser", learned, out)

    three = release("three", taser_model_dict(tokenizer.vocab_size, experts=3), encoder=settings | {"num_expert": 3})
    refused(convert_checkpoint, out, r"experts \[0, 1, 2\]", "import_taser", three, out)

    name = "ctx_model.encoder.encoder.layer.5.moe_layer.output_layers.1.dense.bias"
    split = release("split", model_dict | {name: model_dict[name] + 1})
    text = refused(convert_checkpoint, out, "ctx_model.encoder does not repeat question_model.encoder", "import_taser", split, out)
    assert name in text

    missing = release("missing", {k: v for k, v in model_dict.items() if ".moe_layer.interm_layers.1." not in k})
    text = refused(convert_checkpoint, out, "4 missing", "import_taser", missing, out)  # 2 blocks x (weight, bias) of expert 1's intermediate dense
    assert "question_model.encoder.encoder.layer.2.moe_layer.interm_layers.1.dense.weight" in text

    torch.save(dpr_cp_state(dpr_pair, {"pretrained_model_cfg": tiny_pretrained}), tmp_path / "dpr.cp")
    refused(convert_checkpoint, out, "no mixture-of-experts blocks.*import_dpr_cp", "import_taser", tmp_path / "dpr.cp", out)


# -- sentence-transformers ------------------------------------------------------------------
def st_layout_vectors(directory, texts) -> torch.Tensor:
    """Vectors of a sentence-transformers directory read with transformers alone, as its modules.json says."""
    from transformers import AutoModel, AutoTokenizer

    modules = json.loads((directory / "modules.json").read_text())
    kinds = [m["type"].rsplit(".", 1)[1] for m in modules]
    assert kinds[:2] == ["Transformer", "Pooling"] and kinds[2:] in ([], ["Normalize"])
    pooling = json.loads((directory / modules[1]["path"] / "config.json").read_text())
    max_length = json.loads((directory / "sentence_bert_config.json").read_text())["max_seq_length"]
    tokenizer, encoder = AutoTokenizer.from_pretrained(directory), AutoModel.from_pretrained(directory).eval()
    enc = tokenizer(texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
    with torch.no_grad():
        hidden = encoder(**enc).last_hidden_state
    if pooling["pooling_mode_mean_tokens"]:
        mask = enc["attention_mask"].unsqueeze(-1).float()
        vectors = (hidden * mask).sum(1) / mask.sum(1)
    else:
        assert pooling["pooling_mode_cls_token"]
        vectors = hidden[:, 0]
    return torch.nn.functional.normalize(vectors, dim=-1) if "Normalize" in kinds else vectors


def test_sentence_transformers_export_of_a_shared_model(tiny_pretrained, tokenizer, tmp_path):
    torch.manual_seed(0)
    model, _ = load_model(tiny_model_cfg(tiny_pretrained, "shared", pooling="mean", normalize=True, similarity="cosine"))
    model.save(tmp_path / "shared", tokenizer)
    out = convert_checkpoint("export_sentence_transformers", tmp_path / "shared", tmp_path / "st")
    config = json.loads((out / "config_sentence_transformers.json").read_text())
    assert config["similarity_fn_name"] == "cosine" and json.loads((out / "sentence_bert_config.json").read_text())["max_seq_length"] == 64
    questions, passages = our_vectors(tmp_path / "shared", "question"), our_vectors(tmp_path / "shared", "passage")
    torch.testing.assert_close(st_layout_vectors(out, QUESTIONS), questions, **TOL)
    torch.testing.assert_close(st_layout_vectors(out, passage_strings(tokenizer)), passages, **TOL)
    st = pytest.importorskip("sentence_transformers")
    loaded = st.SentenceTransformer(str(out), device="cpu")
    torch.testing.assert_close(torch.from_numpy(loaded.encode(QUESTIONS)), questions, **TOL)
    torch.testing.assert_close(torch.from_numpy(loaded.encode(passage_strings(tokenizer))), passages, **TOL)


def test_sentence_transformers_export_of_a_dpr_model(dpr_pair, tokenizer, tmp_path):
    question_dir, ctx_dir, _ = dpr_pair
    checkpoint = convert_checkpoint("import_hf_dpr", question_dir, tmp_path / "dpr", ctx_source=ctx_dir)
    out = convert_checkpoint("export_sentence_transformers", checkpoint, tmp_path / "st")
    router = json.loads((out / "router_config.json").read_text())
    assert router["structure"] == {"query": ["query_0_Transformer", "query_1_Pooling"], "document": ["document_0_Transformer", "document_1_Pooling"]}
    st = pytest.importorskip("sentence_transformers")
    loaded = st.SentenceTransformer(str(out), device="cpu")
    torch.testing.assert_close(torch.from_numpy(loaded.encode_query(QUESTIONS)), dpr_vectors(dpr_pair, tokenizer, "question"), **TOL)
    torch.testing.assert_close(torch.from_numpy(loaded.encode_document(passage_strings(tokenizer))), dpr_vectors(dpr_pair, tokenizer, "passage"), **TOL)
    assert loaded.similarity_fn_name == "dot"


# -- exports that cannot be, outputs, settings ----------------------------------------------
def test_export_refusals_and_outputs(tiny_pretrained, tokenizer, taser_release, tmp_path):
    shared, _ = load_model(tiny_model_cfg(tiny_pretrained, "shared"))
    shared.save(tmp_path / "shared", tokenizer)
    out = tmp_path / "out"
    refused(convert_checkpoint, out, "holds a 'shared' model.*only a 'dpr' model", "export_hf_dpr", tmp_path / "shared", out)
    refused(convert_checkpoint, out, "only a 'taser' model exports to TASER's layout", "export_taser", tmp_path / "shared", out, base_model="bert-base-uncased")
    taser = convert_checkpoint("import_taser", taser_release[0], tmp_path / "taser")
    refused(convert_checkpoint, out, "sentence-transformers cannot express that", "export_sentence_transformers", taser, out)
    learned, _ = load_model(tiny_model_cfg(tiny_pretrained, "taser", taser={"specialized_layers": [0], "routing": "learned_sequence"}))
    learned.save(tmp_path / "learned", tokenizer)
    refused(export_taser_release, out, "cannot express routing=learned_sequence, specialised blocks \\[0\\]", tmp_path / "learned", out, "bert-base-uncased")
    # an existing output is refused, replaced only when asked
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(ConversionError, match="exists: choose another output, or pass overwrite=true"):
        convert_checkpoint("export_sentence_transformers", tmp_path / "shared", out)
    assert (out / "keep.txt").read_text() == "mine"
    convert_checkpoint("export_sentence_transformers", tmp_path / "shared", out, overwrite=True)
    assert (out / "modules.json").is_file() and not (out / "keep.txt").exists()


@pytest.mark.parametrize(
    "overrides, words",
    [
        (["conversion=import_hf_dpr", "source=q", "output=o"], ["ctx_source", "needed by import_hf_dpr"]),
        (["conversion=export_hf_dpr", "source=c", "output=o", "base_model=bert-base-uncased"], ["base_model applies to"]),
        (["conversion=export_sentence_transformers", "source=c", "output=o", "allow_pickle=true"], ["allow_pickle applies to imports"]),
        (["conversion=import_dpr_cp", "source=c", "output=o", "max_length=1"], ["max_length must be an integer >= 2"]),
        (["conversion=export_taser", "source=c", "output=o"], ["export_taser needs base_model=", "pretrained_model_cfg"]),
        (["conversion=import_dpr", "source=c", "output=o"], ["conversion", "import_hf_dpr, import_dpr_cp, import_taser, export_hf_dpr"]),
        (["conversion=import_taser", "source=c", "output=o", "+base_modle=x"], ["base_modle", "ConvertJob"]),
    ],
)
def test_the_script_config_refuses_settings_a_conversion_does_not_use(overrides, words):
    from hydra import compose, initialize_config_dir
    from hydra.errors import ConfigCompositionException

    from taser.cli import CONFIG_DIR, typed

    with pytest.raises((ConfigCompositionException, ValueError)) as info:
        with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
            typed(compose(config_name="convert_checkpoint", overrides=overrides))
    text, err = "", info.value
    while err is not None:
        text, err = text + f"{err}\n", err.__cause__
    for word in words:
        assert word in text, (word, text)


def test_the_script_config_composes():
    from hydra import compose, initialize_config_dir

    from taser.cli import CONFIG_DIR, typed
    from taser.pipeline.jobs import ConvertJob

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        job = typed(compose(config_name="convert_checkpoint", overrides=["conversion=import_taser", "source=s", "output=o", "allow_pickle=true"]))
    assert isinstance(job, ConvertJob) and job.conversion == "import_taser" and job.allow_pickle and job.base_model is None


@pytest.mark.slow
def test_script_converts_and_encode_passages_reads_the_result(dpr_pair, tokenizer, tmp_path):
    question_dir, ctx_dir, _ = dpr_pair
    out = tmp_path / "dpr"
    run = lambda script, *args: subprocess.run(
        [sys.executable, str(ROOT / "scripts" / script), *args], cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    proc = run("convert_checkpoint.py", "conversion=import_hf_dpr", f"source={question_dir}", f"ctx_source={ctx_dir}", f"output={out}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == str(out)
    passages = tmp_path / "passages.tsv"
    passages.write_text("id\ttext\ttitle\n" + "".join(f"{i}\t{text}\t{title}\n" for i, (title, text) in enumerate(PASSAGES)))
    proc = run("encode_passages.py", f"checkpoint={out}", f"passages={passages}", f"out_dir={tmp_path / 'emb'}", "shard_id=0", "num_shards=1",
               "precision=fp32", "device=cpu")
    assert proc.returncode == 0, proc.stderr[-3000:]
    chunks = sorted((tmp_path / "emb").rglob("chunk_*.npz"))
    assert chunks
    vectors, ids = [], []
    for chunk in chunks:
        with np.load(chunk) as data:
            vectors.append(data["vectors"])
            ids += data["ids"].tolist()
    assert ids == [str(i) for i in range(len(PASSAGES))]
    # the vectors are the imported model's own, and DPR's encoders' (so the script wrote what the model computes)
    written = torch.from_numpy(np.concatenate(vectors))
    torch.testing.assert_close(written, our_vectors(out, "passage"), **TOL)
    torch.testing.assert_close(written, dpr_vectors(dpr_pair, tokenizer, "passage"), **TOL)
    with pytest.raises(ConversionError, match="exists: choose another output"):  # in-process: a script start costs ~10 s
        convert_checkpoint("import_hf_dpr", question_dir, out, ctx_source=ctx_dir)
