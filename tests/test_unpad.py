"""Padding-free encoding (taser.models.unpad) computes what the padded path computes: the same
vectors, routing losses and gradients, for every model type and TASER's routed variants."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModel, BertConfig, RobertaConfig

from taser.models import unpad as unpad_module
from taser.models.biencoder import BiEncoder
from taser.models.config import BiEncoderConfig
from taser.models.routers import RoutingContext
from taser.models.settings import ModelSettings
from taser.models.taser_encoder import moe_modules
from taser.models.unpad import PackedLayout, encoder_states, position_offset

VOCAB = 120
QUESTION_LENGTHS = [1, 9, 3, 17]  # a question of [CLS] alone, and very different lengths
PASSAGE_LENGTHS = [41, 2, 13, 29, 1, 7]

VARIANTS = {
    "dpr": ("dpr", {}),
    "shared": ("shared", {}),
    "taser": ("taser", {}),
    "taser_seq": ("taser", {"routing": "learned_sequence"}),
    "taser_token": ("taser", {"routing": "learned_token"}),
    "taser_token_shared_gate": ("taser", {"routing": "learned_token", "shared_gate": True, "entropy_weight": 0.1}),
    "taser_attention": ("taser", {"specialize": "attention"}),
    "taser_attention_seq": ("taser", {"specialize": "attention", "routing": "learned_sequence"}),
    "taser_attention_token": ("taser", {"specialize": "attention", "routing": "learned_token", "num_experts": 3}),
}


def batch(lengths: list[int], seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    mask = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    ids = torch.randint(1, VOCAB, mask.shape, generator=g) * mask  # pad id 0
    return {"input_ids": ids, "attention_mask": mask}


def tiny_encoder(seed: int, attention: str = "taser_sdpa", layers: int = 3):
    torch.manual_seed(seed)
    cfg = BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=layers, num_attention_heads=4, intermediate_size=64,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )
    return AutoModel.from_config(cfg, attn_implementation=attention)


def build(variant: str, pooling: str = "mean") -> BiEncoder:
    model_type, settings = VARIANTS[variant]
    settings = {"specialized_layers": [0, 2], **settings} if model_type == "taser" else {}
    config = BiEncoderConfig(model_type=model_type, pooling=pooling, taser=settings)
    model = BiEncoder(config, tiny_encoder(0), tiny_encoder(1) if model_type == "dpr" else None)
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():  # experts that differ, routers that spread their choices
        for moe in moe_modules(model.question_encoder):
            for expert in moe.experts[1:]:
                for p in expert.parameters():
                    p.add_(torch.randn(p.shape, generator=g) * 0.3)
        for name, p in model.named_parameters():
            if "router" in name or "taser_gate" in name:
                p.copy_(torch.randn(p.shape, generator=g))
    return model


@pytest.fixture
def no_gumbel_noise(monkeypatch):
    """Learned routers in training draw Gumbel noise per routed unit: B x L units padded, N
    packed. Zero noise makes the training-mode choice (and its straight-through gate) the same."""
    monkeypatch.setattr(torch.Tensor, "exponential_", lambda self, *a, **k: self.fill_(1.0))


@pytest.fixture
def packings(monkeypatch):
    """Counts the packed passes, so that a test cannot compare the padded path with itself."""
    made = []
    original = PackedLayout.from_mask.__func__

    def counting(cls, mask, *args, **kwargs):
        made.append(tuple(mask.shape))
        return original(cls, mask, *args, **kwargs)

    monkeypatch.setattr(PackedLayout, "from_mask", classmethod(counting))
    return made


def assert_same_gradients(actual: dict, expected: dict, tol: float) -> None:
    """Equal to `tol`, relative to each gradient's largest entry, or to a thousandth of the largest
    of all when that is larger (some are zero in exact arithmetic, e.g. the attention keys' bias)."""
    assert actual.keys() == expected.keys()
    floor = 1e-3 * max(float(g.abs().max()) for g in expected.values())
    for name, grad in expected.items():
        error = float((actual[name] - grad).abs().max())
        scale = max(float(grad.abs().max()), floor)
        assert error <= tol * scale, f"{name}: max difference {error:.3g}, largest entry {float(grad.abs().max()):.3g}"


def run(model: BiEncoder, unpad: bool, q: dict, p: dict):
    model.unpad = unpad
    model.zero_grad(set_to_none=True)
    out = model(q, p)
    scores = out.questions @ out.passages.T
    loss = scores.square().mean() + (out.aux_loss.total if out.aux_loss is not None else 0.0)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out, grads


# float64 shows the two paths compute the same function (errors ~1e-15; the routers' logits are
# float32 by design, ~1e-7); float32 shows it at the precision training runs in.
DTYPES = [(variant, torch.float64, 1e-6) for variant in VARIANTS] + [
    (variant, torch.float32, 1e-3) for variant in ("dpr", "taser_token", "taser_attention_seq")
]


@pytest.mark.parametrize(("variant", "dtype", "tol"), DTYPES)
def test_same_vectors_losses_and_gradients(variant, dtype, tol, no_gumbel_noise, packings):
    model = build(variant).to(dtype).train()  # training mode: routers' gates carry gradients; dropout is 0
    q, p = batch(QUESTION_LENGTHS, 0), batch(PASSAGE_LENGTHS, 1)
    padded, padded_grads = run(model, False, q, p)
    assert not packings
    packed, packed_grads = run(model, True, q, p)
    assert {(4, 17), (6, 41)} <= set(packings)  # the question pass and the passage pass ran packed

    torch.testing.assert_close(packed.questions, padded.questions, atol=tol, rtol=tol)
    torch.testing.assert_close(packed.passages, padded.passages, atol=tol, rtol=tol)
    assert (packed.aux_loss is None) == (padded.aux_loss is None) == ("learned" not in str(VARIANTS[variant][1]))
    if padded.aux_loss is not None:
        torch.testing.assert_close(packed.aux_loss.total, padded.aux_loss.total, atol=tol, rtol=tol)
        parts = lambda aux: {k: float(v) for k, v in aux.parts.items()}  # noqa: E731
        assert parts(packed.aux_loss) == pytest.approx(parts(padded.aux_loss), rel=tol, abs=tol)
    assert any("router" in n or "taser_gate" in n for n in padded_grads) == (padded.aux_loss is not None)
    assert_same_gradients(packed_grads, padded_grads, tol)


@pytest.mark.parametrize("variant", ["taser_seq", "taser_token", "taser_attention_seq", "taser_attention_token"])
def test_routers_count_real_tokens_only(variant, no_gumbel_noise):
    """Both paths record one decision per real token (token routing) or per input (sequence
    routing), pads left out, and the same decisions, which use more than one expert."""
    model = build(variant).train()
    routing = VARIANTS[variant][1]["routing"]
    p = batch(PASSAGE_LENGTHS, 1)
    decisions = {}
    for unpad in (False, True):
        context = RoutingContext("passage", p["attention_mask"], getattr(model.question_encoder, "taser_gate", None))
        hidden = encoder_states(model.question_encoder, p["input_ids"], p["attention_mask"], unpad, taser_routing=context)
        assert hidden.shape == (*p["input_ids"].shape, 32)
        decisions[unpad] = [r.choice for r in context.records]
    units = sum(PASSAGE_LENGTHS) if routing == "learned_token" else len(PASSAGE_LENGTHS)
    # packed tokens come in the layout's order (by length group); the padded path's in row-major order
    row_major = PackedLayout.from_mask(p["attention_mask"]).indices.argsort() if routing == "learned_token" else slice(None)
    assert len(decisions[True]) == len(decisions[False]) == 2  # two specialised layers
    for padded, packed in zip(decisions[False], decisions[True]):
        assert padded.numel() == packed.numel() == units
        assert torch.equal(padded, packed[row_major])
    assert len(torch.cat(decisions[True]).unique()) > 1


@pytest.mark.parametrize("group_ratio", [0.0, 0.8, 1.0])  # one masked group; a few; a group per length (CPU's default)
def test_chunked_attention_kernel_and_cls_pooling_agree(group_ratio, packings, monkeypatch):
    """CPU training with attention dropout runs the chunked kernel; a rate too small to drop
    anything (1e-9) runs it without randomness, so both paths must agree, whatever the groups."""
    monkeypatch.setitem(unpad_module.GROUP_LENGTH_RATIO, "cpu", group_ratio)
    model = build("shared", pooling="cls").double().train()
    model.set_dropout(hidden=0.0, attention=1e-9)
    q, p = batch(QUESTION_LENGTHS, 0), batch(PASSAGE_LENGTHS, 1)
    padded, padded_grads = run(model, False, q, p)
    packed, packed_grads = run(model, True, q, p)
    assert {(4, 17), (6, 41)} <= set(packings)
    torch.testing.assert_close(packed.passages, padded.passages, atol=1e-9, rtol=1e-9)
    assert_same_gradients(packed_grads, padded_grads, 1e-9)


def test_attention_dropout_is_seeded():
    """Real attention dropout draws its masks per length group: a seed reproduces the packed
    pass (as the gradient cache's RNG replay needs), and the masks do drop."""
    model = build("shared").train()
    model.set_dropout(hidden=0.0, attention=0.2)
    model.unpad = True
    p = batch(PASSAGE_LENGTHS, 1)
    vectors = []
    for seed in (5, 5, 6):
        torch.manual_seed(seed)
        vectors.append(model.encode(p["input_ids"], p["attention_mask"], "passage"))
    torch.testing.assert_close(vectors[0], vectors[1], atol=0, rtol=0)
    assert not torch.allclose(vectors[0], vectors[2])


def test_roberta_positions_start_after_the_padding_index():
    torch.manual_seed(0)
    cfg = RobertaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, pad_token_id=1)
    encoder = AutoModel.from_config(cfg, attn_implementation="taser_sdpa").eval()
    assert unpad_module.position_offset(encoder) == 2
    p = batch(PASSAGE_LENGTHS, 1)
    p["input_ids"] = torch.where(p["attention_mask"].bool(), p["input_ids"].clamp(min=2), 1)  # RoBERTa's pad id is 1
    mask = p["attention_mask"].unsqueeze(-1)
    with torch.no_grad():
        padded = encoder_states(encoder, p["input_ids"], p["attention_mask"], False)
        packed = encoder_states(encoder, p["input_ids"], p["attention_mask"], True)
    torch.testing.assert_close(packed, padded * mask, atol=1e-5, rtol=1e-4)


def test_layout_round_trip_and_edge_cases():
    mask = batch([3, 1, 4], 0)["attention_mask"]
    layout = PackedLayout.from_mask(mask)
    # packed by length group, longest first: row 2's tokens, then row 0's, then row 1's
    assert layout.num_tokens == 8 and layout.starts.tolist() == [4, 7, 0]
    assert layout.row_ids.tolist() == [2, 2, 2, 2, 0, 0, 0, 1]
    assert layout.position_ids().tolist() == [0, 1, 2, 3, 0, 1, 2, 0]
    x = torch.randn(3, 4, 5)
    torch.testing.assert_close(layout.unpack(layout.pack(x)), x * mask.unsqueeze(-1))
    tokens, sub = layout.select_rows(torch.tensor([0, 2]))
    assert tokens.tolist() == [0, 1, 2, 3, 4, 5, 6] and sub.starts.tolist() == [4, 0]
    # every CPU group fills its length: the packed heads are the groups' layouts, viewed, not copied
    assert layout.slots is None
    heads = torch.randn(1, 3, layout.num_tokens, 2).transpose(1, 2).contiguous().transpose(1, 2)  # as transformers hands them
    assert all(part.data_ptr() >= heads.data_ptr() and part._base is not None for part in layout.unpack_heads(heads))
    # attention length groups: by decreasing length, cut below 0.8 x the group's longest
    layout = PackedLayout.from_mask(batch([5, 4, 9, 8, 1], 0)["attention_mask"], group_ratio=0.8)
    assert [(g.rows, g.length) for g in layout.groups] == [(2, 9), (2, 5), (1, 1)]
    assert layout.groups[0].mask.shape == (2, 1, 9, 9) and layout.groups[1].mask is not None and layout.groups[2].mask is None
    assert layout.slots is not None  # padded groups: scattered into their layouts
    heads = torch.randn(1, 3, layout.num_tokens, 2)
    parts = layout.unpack_heads(heads)
    assert [tuple(x.shape) for x in parts] == [(2, 3, 9, 2), (2, 3, 5, 2), (1, 3, 1, 2)]
    torch.testing.assert_close(layout.pack_heads([x.transpose(1, 2) for x in parts]), heads.transpose(1, 2))
    assert [g.rows for g in PackedLayout.from_mask(batch([5, 4, 9], 0)["attention_mask"], group_ratio=0.0).groups] == [3]
    # on CPU, one unmasked group per distinct length
    cpu = PackedLayout.from_mask(batch([5, 4, 9, 5, 1], 0)["attention_mask"])
    assert [(g.rows, g.length, g.mask) for g in cpu.groups] == [(1, 9, None), (2, 5, None), (1, 4, None), (1, 1, None)]
    with pytest.raises(ValueError, match="at least one real token"):
        PackedLayout.from_mask(torch.tensor([[1, 1], [0, 0]]))


def test_no_padding_runs_the_plain_path(packings):
    model = build("taser_token").eval()
    q = batch([5, 5, 5], 0)
    model.unpad = True
    model.encode(q["input_ids"], q["attention_mask"], "question")
    assert not packings  # nothing to drop: the encoder runs as it is


def test_unpad_setting_follows_the_attention_kernel():
    model = BiEncoder(BiEncoderConfig(model_type="shared"), tiny_encoder(0, attention="sdpa"))
    q = batch(QUESTION_LENGTHS, 0)
    assert model.unpad is None and not model.runs_unpadded(model.question_encoder)
    model.encode(q["input_ids"], q["attention_mask"], "question")  # padded, with transformers' sdpa
    model.unpad = True
    with pytest.raises(ValueError, match="unpad=True needs attention=taser_sdpa"):
        model.encode(q["input_ids"], q["attention_mask"], "question")
    assert BiEncoder(BiEncoderConfig(model_type="shared"), tiny_encoder(0)).runs_unpadded(model.question_encoder) is False
    assert build("shared").runs_unpadded(build("shared").question_encoder) is True
    assert ModelSettings(unpad=None).unpad is None
    with pytest.raises(ValueError, match="model.unpad=true needs model.attention=taser_sdpa"):
        ModelSettings(unpad=True, attention="eager")


def test_a_packed_batch_gets_no_token_by_token_mask_from_transformers():
    """transformers >= 5.25 hands the encoder's position ids to its mask builder, which reads
    restarting ids as packed sequences and asks the attention's mask function for a (tokens x
    tokens) mask, with no padding mask and the no-mask shortcut off; `taser_sdpa` packs on its own
    and refused that mask. Asked as 5.25 asks (whatever transformers is installed), it builds none;
    a padding mask is still built."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, bidirectional_mask_function, create_bidirectional_mask

    encoder = tiny_encoder(0)
    mask_function = ALL_MASK_ATTENTION_FUNCTIONS[encoder.config._attn_implementation]
    tokens = 15  # three packed sequences of 5, 3 and 7 tokens
    packed = mask_function(batch_size=1, q_length=tokens, kv_length=tokens, mask_function=bidirectional_mask_function,
                           attention_mask=None, allow_is_bidirectional_skip=False, allow_is_causal_skip=False)
    assert packed is None
    layout = PackedLayout.from_mask(batch([5, 3, 7], seed=0)["attention_mask"])
    position_ids = layout.position_ids(position_offset(encoder)).unsqueeze(0)
    embeds = torch.zeros(1, tokens, 32)
    assert create_bidirectional_mask(config=encoder.config, inputs_embeds=embeds, attention_mask=None, position_ids=position_ids) is None
    padded = create_bidirectional_mask(config=encoder.config, inputs_embeds=torch.zeros(2, 4, 32), attention_mask=torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]]))
    assert padded is not None and padded.shape == (2, 1, 4, 4) and not bool(padded[0, 0, 0, 3])


def test_pretrained_encoders_load_without_hub_kernels(tiny_pretrained, monkeypatch):
    """transformers >= 5.25 replaces layers with hub kernels unless told not to (and fails where
    the `kernels` package is missing); taser's loaders tell it not to, for the encoder and the reader."""
    import transformers

    from taser.models.biencoder import _load_encoder
    from taser.reader.model import Reader

    seen = []
    real = transformers.AutoModel.from_pretrained.__func__

    def spy(cls, *args, **kwargs):
        seen.append(kwargs.get("use_kernels"))
        return real(cls, *args, **kwargs)

    monkeypatch.setattr(transformers.AutoModel, "from_pretrained", classmethod(spy))
    _load_encoder(tiny_pretrained)
    Reader.from_pretrained(tiny_pretrained, 64, 16)
    assert seen == [False, False]
