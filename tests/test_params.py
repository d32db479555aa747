"""Parameter counts: exact BERT-base figures (meta device: no weights) and active counts."""

from __future__ import annotations

import pytest
import torch
from transformers import BertConfig, BertModel

from taser.models.biencoder import BiEncoder
from taser.models.config import BiEncoderConfig
from taser.models.params import count, parameter_report

BERT_BASE = 109_482_240
SPECIALISED_FFN = 4_723_968  # one more BERT-base FFN: 768*3072 + 3072 + 3072*768 + 768 + 2*768


def bert_base() -> BertModel:
    with torch.device("meta"):
        return BertModel(BertConfig())


def test_bert_base_shared_and_dpr():
    shared = parameter_report(BiEncoder(BiEncoderConfig(model_type="shared"), bert_base()))
    assert shared == {"model_type": "shared", "total": BERT_BASE, "active_question": BERT_BASE, "active_passage": BERT_BASE}
    dpr = parameter_report(BiEncoder(BiEncoderConfig(model_type="dpr"), bert_base(), bert_base()))
    assert dpr["total"] == 218_964_480
    assert dpr["active_question"] == dpr["active_passage"] == BERT_BASE


def test_bert_base_taser():
    model = BiEncoder(BiEncoderConfig(model_type="taser", taser={}), bert_base())
    report = parameter_report(model)
    assert model.config.taser["specialized_layers"] == [2, 5, 8, 11]
    assert report["total"] == 128_378_112 == BERT_BASE + 4 * SPECIALISED_FFN
    # a question (or a passage) runs one expert per specialised block: BERT-base's size
    assert report["active_question"] == report["active_passage"] == BERT_BASE


def tiny_bert(layers: int = 4) -> BertModel:
    with torch.device("meta"):
        return BertModel(BertConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=layers, num_attention_heads=4, intermediate_size=128))


@pytest.mark.parametrize("specialize", ["ffn", "attention"])
def test_learned_routing_counts_one_expert_per_layer_plus_gates(specialize):
    base_total = count(tiny_bert())
    settings = {"routing": "learned_token", "num_experts": 3, "specialize": specialize, "specialize_every": 1}
    model = BiEncoder(BiEncoderConfig(model_type="taser", taser=settings), tiny_bert())
    report = parameter_report(model)
    sublayer = (
        count(model.question_encoder.encoder.layer[1].output.experts[0])
        if specialize == "ffn"
        else count(model.question_encoder.encoder.layer[1].attention.experts[0])
    )
    gate = 64 * 3 + 3
    assert report["total"] == base_total + 2 * (2 * sublayer + gate)  # blocks 1 and 3
    assert report["active_question"] == report["active_passage"] == base_total + 2 * gate
