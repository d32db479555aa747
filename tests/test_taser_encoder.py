"""TASER specialisation on tiny random BERT models: equivalence at init, routing, gradients,
auxiliary losses, layout and save/load."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import BertConfig, BertModel

from taser.models.biencoder import BiEncoder, load_tokenizer
from taser.models.config import BiEncoderConfig
from taser.models.inputs import tokenize_passages, tokenize_questions
from taser.models.moe import MoEAttention, MoEFeedForward
from taser.models.routers import RoutingContext
from taser.models.taser_config import TaserConfig, layout
from taser.models.taser_encoder import encode, moe_modules, specialize_encoder

QUESTIONS = ["who wrote hamlet?", "what is the capital of france", "when did the second world war end in europe"]
TITLES = ["Hamlet", "Paris", "World War II"]
TEXTS = [
    "Hamlet is a tragedy written by William Shakespeare between 1599 and 1601.",
    "Paris is the capital and most populous city of France.",
    "The war in Europe ended with the surrender of Germany on 8 May 1945, a day celebrated since.",
]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("shipped:all-MiniLM-L6-v2")


@pytest.fixture(scope="module")
def batch(tokenizer):
    return tokenize_questions(tokenizer, QUESTIONS, 32), tokenize_passages(tokenizer, TITLES, TEXTS, 64)


@pytest.fixture(scope="module")
def base(tokenizer):
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=64, num_hidden_layers=6, num_attention_heads=4, intermediate_size=128)
    return BertModel(cfg)


def taser(base, **settings) -> BiEncoder:
    return BiEncoder(BiEncoderConfig(model_type="taser", taser=dict(settings)), copy.deepcopy(base))


def no_dropout(model: BiEncoder) -> BiEncoder:
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    return model


def perturb_experts(model: BiEncoder, scale: float = 0.5) -> None:
    """Make the experts differ from each other (at init they are copies)."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for moe in moe_modules(model.question_encoder):
            for expert in moe.experts[1:]:
                for p in expert.parameters():
                    p.add_(torch.randn(p.shape, generator=g) * scale * p.std().clamp(min=0.02))


def grad_norm(module: torch.nn.Module) -> float:
    grads = [p.grad for p in module.parameters() if p.grad is not None]
    return float(sum(g.abs().sum() for g in grads)) if grads else 0.0


# -- equivalence at initialisation ----------------------------------------------------------
@pytest.mark.parametrize("specialize", ["ffn", "attention"])
@pytest.mark.parametrize("routing", ["deterministic", "learned_sequence", "learned_token"])
def test_initial_taser_equals_base_model(base, batch, specialize, routing):
    q, p = batch
    shared = BiEncoder(BiEncoderConfig(model_type="shared"), copy.deepcopy(base)).eval()
    model = taser(base, specialize=specialize, routing=routing).eval()
    kind = MoEFeedForward if specialize == "ffn" else MoEAttention
    assert len([m for m in model.modules() if isinstance(m, kind)]) == 2
    with torch.no_grad():
        want, got = shared(q, p), model(q, p)
    torch.testing.assert_close(got.questions, want.questions, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got.passages, want.passages, atol=1e-5, rtol=1e-5)


# -- deterministic routing: each input type trains only its own expert ---------------------
@pytest.mark.parametrize("specialize", ["ffn", "attention"])
def test_deterministic_routing_isolates_expert_gradients(base, batch, specialize):
    q, p = batch
    for side, inputs, used, unused in (("question", q, 0, 1), ("passage", p, 1, 0)):
        model = taser(base, specialize=specialize)
        vec, aux = model.encode_with_routing(inputs["input_ids"], inputs["attention_mask"], side)
        vec.pow(2).sum().backward()
        for moe in moe_modules(model.question_encoder):
            assert grad_norm(moe.experts[used]) > 0
            assert all(g is None or not g.any() for g in (p_.grad for p_ in moe.experts[unused].parameters()))
        assert aux is None


def test_deterministic_routing_needs_input_type(base, batch):
    model = taser(base)
    q, _ = batch
    with pytest.raises(RuntimeError, match="input type"):
        model.question_encoder(input_ids=q["input_ids"], attention_mask=q["attention_mask"])
    model.question_encoder(input_ids=q["input_ids"], attention_mask=q["attention_mask"], taser_routing=RoutingContext("passage"))
    with pytest.raises(ValueError, match="input type"):
        RoutingContext("document")


# -- learned routing ------------------------------------------------------------------------
def gates(model: BiEncoder) -> list[torch.nn.Module]:
    found = [m.router if m.router is not None else model.question_encoder.taser_gate for m in moe_modules(model.question_encoder)]
    return list({id(g): g for g in found}.values())


@pytest.mark.parametrize("specialize", ["ffn", "attention"])
@pytest.mark.parametrize("routing", ["learned_sequence", "learned_token"])
def test_learned_gates_receive_gradients(base, batch, specialize, routing):
    q, p = batch
    model = taser(base, specialize=specialize, routing=routing, load_balance_weight=0.0).train()
    perturb_experts(model)
    out = model(q, p)
    aux = out.aux_loss
    assert set(aux.parts) == {"load_balance", "entropy"}
    ((out.questions * out.passages).sum() + aux.total).backward()
    for gate in gates(model):
        assert gate.proj.weight.grad is not None and gate.proj.weight.grad.abs().sum() > 0


def test_shared_gate_is_one_module(base, batch):
    q, p = batch
    model = taser(base, routing="learned_token", shared_gate=True).train()
    (shared,) = gates(model)
    assert shared is model.question_encoder.taser_gate
    assert sum(1 for k in model.state_dict() if k.endswith("proj.weight")) == 1
    out = model(q, p)
    ((out.questions * out.passages).sum() + out.aux_loss.total).backward()
    assert shared.proj.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("routing", ["learned_sequence", "learned_token"])
def test_load_balancing_changes_gate_gradients(base, batch, routing):
    q, p = batch
    grads = []
    for weight in (0.0, 0.0, 1.0):
        torch.manual_seed(2)  # the same gate initialisation,
        model = taser(base, routing=routing, load_balance_weight=weight).train()
        torch.manual_seed(3)  # Gumbel noise and dropout in every run
        out = model(q, p)
        ((out.questions * out.passages).sum() + out.aux_loss.total).backward()
        grads.append(torch.cat([g.proj.weight.grad.flatten() for g in gates(model)]))
    torch.testing.assert_close(grads[0], grads[1], rtol=0, atol=0)  # the runs are comparable
    assert not torch.allclose(grads[0], grads[2])


def test_aux_loss_is_averaged_and_belongs_to_its_call(base, batch):
    q, p = batch
    model = taser(base, routing="learned_sequence", load_balance_weight=0.5, entropy_weight=0.1).train()
    torch.manual_seed(5)
    aux = model(q, p).aux_loss
    expected = float(0.5 * aux.parts["load_balance"] + 0.1 * aux.parts["entropy"])
    assert aux.total.requires_grad
    assert aux.total.item() == pytest.approx(expected, rel=1e-5)
    torch.manual_seed(5)
    again = model(q, p).aux_loss  # a second call's loss is its own, not a sum with the first's
    assert again.total.item() == pytest.approx(aux.total.item(), rel=1e-6)
    with torch.no_grad():
        assert not model(q, p).aux_loss.total.requires_grad  # a pass without autograd feeds no gradient


def test_eval_routing_is_argmax_and_deterministic(base, batch):
    q, p = batch
    model = no_dropout(taser(base, routing="learned_token"))
    perturb_experts(model, scale=2.0)
    model.eval()
    with torch.no_grad():
        torch.manual_seed(0)
        first = model(q, p)
        torch.manual_seed(1)
        second = model(q, p)
        torch.testing.assert_close(first.questions, second.questions, rtol=0, atol=0)
        torch.testing.assert_close(first.passages, second.passages, rtol=0, atol=0)
        # training samples routes: some seed gives another output
        model.train()
        samples = []
        for seed in range(4):
            torch.manual_seed(seed)
            samples.append(model(q, p).passages)
    assert any(not torch.allclose(samples[0], s) for s in samples[1:])
    gate = gates(model)[0].eval()
    routing = gate(torch.randn(5, 64))
    assert routing.gate is None and torch.equal(routing.choice, routing.logits.argmax(-1))


# -- layout and settings ---------------------------------------------------------------------
def test_layout_rule():
    assert layout(12, 2) == [2, 5, 8, 11]
    assert layout(6, 2) == [2, 5]
    assert layout(6, 1) == [1, 3, 5]
    assert layout(12, 3) == [3, 7, 11]
    assert TaserConfig.resolve({}, 12).specialized_layers == [2, 5, 8, 11]
    assert TaserConfig.resolve({"specialize_every": 3}, 12).specialized_layers == [3, 7, 11]
    assert TaserConfig.resolve({"specialized_layers": [4, 0], "specialize_every": 1}, 6).specialized_layers == [0, 4]


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"specialized_layers": [1, 6]}, "out of range"),
        ({"specialized_layers": [-1]}, "out of range"),
        ({"specialized_layers": []}, "empty"),
        ({"specialize_every": 0}, "specialize_every"),
        ({"specialize_every": 6}, "no block"),
        ({"num_experts": 3}, "num_experts must be 2"),
        ({"routing": "learned_token", "num_experts": 1}, "num_experts"),
        ({"routing": "random"}, "routing"),
        ({"specialize": "embeddings"}, "specialize"),
        ({"gumbel_tau": 0}, "gumbel_tau"),
        ({"load_balance_weight": -1}, "load_balance_weight"),
        ({"experts": 2}, "unknown taser settings"),
    ],
)
def test_bad_settings_raise(settings, message):
    with pytest.raises(ValueError, match=message):
        TaserConfig.resolve(settings, 6)


def test_specialize_writes_resolved_layout_back(base):
    settings = {"specialize_every": 1, "routing": "learned_token", "num_experts": 3}
    encoder = copy.deepcopy(base).eval()
    specialize_encoder(encoder, settings)
    assert not any(m.training for m in encoder.modules())  # new gates follow the encoder's mode
    assert settings["specialized_layers"] == [1, 3, 5] and settings["gumbel_tau"] == 1.0
    assert [len(m.experts) for m in moe_modules(encoder)] == [3, 3, 3]
    ids = torch.tensor([[101, 2054, 102]])
    assert encode(encoder, ids, torch.ones_like(ids), "question")[1].total.item() > 0  # eval passes record their routing too
    with pytest.raises(ValueError, match="already"):
        specialize_encoder(encoder, settings)


# -- persistence -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "settings",
    [
        {"specialized_layers": [1, 4]},
        {"specialize": "attention", "routing": "learned_token", "shared_gate": True, "num_experts": 3},
    ],
)
def test_save_load_round_trip(base, batch, tmp_path, settings):
    q, p = batch
    model = taser(base, **settings).eval()
    perturb_experts(model)
    model.save(tmp_path / "ckpt")
    loaded = BiEncoder.load(tmp_path / "ckpt", expected_type="taser").eval()
    loaded.unpad = False  # `model` runs transformers' sdpa, padded: compare bit for bit on the same path
    assert loaded.config.taser == model.config.taser
    assert [type(m).__name__ for m in moe_modules(loaded.question_encoder)] == [type(m).__name__ for m in moe_modules(model.question_encoder)]
    with torch.no_grad():
        got, want = loaded(q, p), model(q, p)
        torch.testing.assert_close(got.questions, want.questions, rtol=0, atol=0)
        torch.testing.assert_close(got.passages, want.passages, rtol=0, atol=0)


# -- other BERT-family encoders and the routing losses --------------------------------------
@pytest.mark.parametrize("family", ["roberta", "electra"])
@pytest.mark.parametrize("specialize", ["ffn", "attention"])
def test_other_bert_family_encoders(family, specialize):
    from transformers import AutoConfig, AutoModel

    torch.manual_seed(0)
    cfg = AutoConfig.for_model(family, vocab_size=200, hidden_size=32, num_hidden_layers=3, num_attention_heads=2, intermediate_size=64)
    base = AutoModel.from_config(cfg).eval()
    model = copy.deepcopy(base)
    specialize_encoder(model, {"specialize": specialize, "routing": "learned_token"})
    if specialize == "attention":
        assert model.encoder.layer[2].attention.experts[1].self.config is model.config  # shared, not copied
    ids = torch.randint(3, 200, (2, 9))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    with torch.no_grad():
        want = base(input_ids=ids, attention_mask=mask).last_hidden_state
        got, aux = encode(model.eval(), ids, mask, "passage")
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert aux is not None  # the routers' decisions came back with the pass


def test_routing_losses():
    from taser.models.routers import Routing, RoutingContext, aux_loss, load_balance_loss, router_entropy

    uniform = torch.zeros(4, 2)
    assert load_balance_loss(uniform, torch.tensor([0, 1, 0, 1])).item() == pytest.approx(1.0)
    certain = torch.tensor([[30.0, 0.0]] * 4)
    assert load_balance_loss(certain, torch.zeros(4, dtype=torch.long)).item() == pytest.approx(2.0)
    assert router_entropy(uniform).item() == pytest.approx(torch.log(torch.tensor(2.0)).item())
    assert router_entropy(certain).item() == pytest.approx(0.0, abs=1e-9)
    # masked units (padding) do not count
    context = RoutingContext("question")
    logits = torch.tensor([[30.0, 0.0], [0.0, 30.0], [30.0, 0.0]])
    context.record(Routing(logits.argmax(-1), None, logits), mask=torch.tensor([True, True, False]))
    assert float(aux_loss(context.records, 1.0, 0.0).parts["load_balance"]) == pytest.approx(1.0)
    assert aux_loss([], 1.0, 0.0) is None
