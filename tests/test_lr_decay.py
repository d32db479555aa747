"""AdamW parameter groups: weight-decay exclusions and layer-wise learning-rate decay."""

from __future__ import annotations

import pytest
import torch
from transformers import BertConfig, BertModel

from taser.models.biencoder import BiEncoder
from taser.models.config import BiEncoderConfig
from taser.training.lr_decay import param_groups

LR, WD, DECAY, LAYERS = 1e-3, 0.01, 0.8, 3


def tiny_bert() -> BertModel:
    return BertModel(BertConfig(vocab_size=500, hidden_size=32, num_hidden_layers=LAYERS, num_attention_heads=2, intermediate_size=64))


def settings_by_name(model, groups, encoder_prefix="question_encoder."):
    by_id = {id(p): (g["lr"], g["weight_decay"]) for g in groups for p in g["params"]}
    assert len(by_id) == sum(len(g["params"]) for g in groups)  # no parameter twice
    trained = ((name, p) for name, p in model.named_parameters() if p.requires_grad)
    return {name[len(encoder_prefix):] if name.startswith(encoder_prefix) else name: by_id[id(p)] for name, p in trained}


def expected_lr(name: str) -> float:
    if name.startswith("embeddings."):
        return LR * DECAY**LAYERS
    if name.startswith("encoder.layer."):
        return LR * DECAY ** (LAYERS - 1 - int(name.split(".")[2]))
    return LR


@pytest.mark.parametrize("model_type", ["shared", "dpr", "taser"])
def test_layer_wise_decay(model_type):
    torch.manual_seed(0)
    passage = tiny_bert() if model_type == "dpr" else None
    taser = {"routing": "learned_token", "specialized_layers": [1, 2]} if model_type == "taser" else {}
    model = BiEncoder(BiEncoderConfig(model_type=model_type, taser=taser), tiny_bert(), passage)
    groups = param_groups(model, LR, WD, DECAY)
    settings = settings_by_name(model, groups)
    assert len(settings) == len([p for p in model.parameters() if p.requires_grad])
    for name, (lr, wd) in settings.items():
        local = name.split("encoder.", 1)[1] if name.startswith("passage_encoder.") else name
        assert lr == pytest.approx(expected_lr(local)), name
        no_decay = name.endswith(".bias") or "LayerNorm" in name
        assert wd == (0.0 if no_decay else WD), name
    assert settings["encoder.layer.2.attention.self.query.weight"][0] == pytest.approx(LR)  # top block
    assert "pooler.dense.weight" not in settings  # frozen: no vector uses BERT's pooler
    if model_type == "taser":
        assert settings["encoder.layer.1.output.experts.1.output.dense.weight"] == (pytest.approx(LR * DECAY), WD)
        assert settings["encoder.layer.1.output.router.proj.weight"][0] == pytest.approx(LR * DECAY)
    torch.optim.AdamW(groups, lr=LR)  # accepted as is


def test_no_layer_decay_and_validation():
    model = BiEncoder(BiEncoderConfig(model_type="shared"), tiny_bert())
    groups = param_groups(model, LR, WD, None)
    assert {g["lr"] for g in groups} == {LR}
    assert {g["weight_decay"] for g in groups} == {0.0, WD}
    model.question_encoder.embeddings.word_embeddings.weight.requires_grad_(False)
    trained = [p for p in model.parameters() if p.requires_grad]
    assert sum(len(g["params"]) for g in param_groups(model, LR, WD, None)) == len(trained)  # the frozen embedding left out
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError, match="layer_decay"):
            param_groups(model, LR, WD, bad)
