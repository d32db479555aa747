"""The roofline benchmark's arithmetic (benchmarks/peers/roofline.py): its FLOP count against
torch's counter, and its "before" attention kernel computing what the library's computes."""

import importlib.util
import sys

import pytest
import torch
from conftest import ROOT
from transformers import BertConfig, BertModel


def _load(name: str):
    sys.path.insert(0, str(ROOT / "benchmarks" / "peers"))
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / "peers" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def roofline():
    return _load("roofline")


def test_useful_flops_by_hand(roofline):
    # one layer, h=2, f=3, inputs of 1 and 2 tokens: forward 2n(4h^2 + 2hf) + 4n^2h = 56n + 8n^2
    forward = (56 * 1 + 8 * 1) + (56 * 2 + 8 * 4)
    assert roofline.useful_flops([1, 2], layers=1, hidden=2, ffn=3) == 3 * forward


def test_flop_formula_matches_torch_counter_and_catches_a_wrong_one(roofline, monkeypatch):
    torch.manual_seed(0)
    config = BertConfig(vocab_size=2100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48)
    encoder = BertModel(config, add_pooling_layer=False).eval()
    encoder.set_attn_implementation("eager")  # explicit matmuls: the counter sees the attention core
    roofline.check_flop_count(encoder, config)  # raises SystemExit when they disagree
    monkeypatch.setattr(roofline, "useful_flops", lambda lengths, layers, hidden, ffn: 1.01 * 3 * sum(
        layers * (2 * n * (4 * hidden * hidden + 2 * hidden * ffn) + 4 * n * n * hidden) for n in lengths))
    with pytest.raises(SystemExit, match="disagrees"):
        roofline.check_flop_count(encoder, config)


def test_the_before_kernel_computes_the_library_kernel_function():
    levers = _load("roofline_levers")
    from taser.models.attention import ChunkedDropoutAttention

    before = levers._kernel_before()
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    mask = torch.ones(2, 1, 5, 5, dtype=torch.bool)
    mask[1, ..., 3:] = False
    outs = [kernel.apply(q, k, v, mask, 0.0, 0.5) for kernel in (before, ChunkedDropoutAttention)]
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=1e-12)
    grad = torch.randn_like(outs[0])
    for a, b in zip(torch.autograd.grad(outs[0], (q, k, v), grad), torch.autograd.grad(outs[1], (q, k, v), grad)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_the_masked_fill_code_computes_the_library_function_with_the_same_masks():
    """`library at e72d41c` (masks by masked_fill / where) against the library (masks by arithmetic):
    same seed, same dropout masks, same outputs and gradients."""
    levers = _load("roofline_levers")
    from taser.models.attention import chunked_dropout_attention
    from taser.models.dropout import _MaskedDropout

    attend, dropout = levers._masked_fill_code()
    q, k, v = (torch.randn(2, 3, 6, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(i), requires_grad=True) for i in range(3))
    mask = torch.ones(2, 1, 6, 6, dtype=torch.bool)
    mask[1, ..., 4:] = False
    outs = []
    for fn in (attend, chunked_dropout_attention):
        torch.manual_seed(9)
        outs.append(fn(q, k, v, mask, 0.3))
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=1e-12)
    grad = torch.randn_like(outs[0])
    for a, b in zip(torch.autograd.grad(outs[0], (q, k, v), grad), torch.autograd.grad(outs[1], (q, k, v), grad)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    x = torch.randn(5, 7, requires_grad=True)
    dropped = []
    for fn in (dropout, _MaskedDropout):
        torch.manual_seed(4)
        dropped.append(fn.apply(x, 0.3))
    assert torch.equal(dropped[0], dropped[1]) and (dropped[0] == 0).any()
    assert torch.equal(*(torch.autograd.grad(d, x, torch.ones_like(d))[0] for d in dropped))


def test_the_masked_fill_lever_swaps_the_code_in_and_back():
    levers = _load("roofline_levers")
    import taser.models.attention as attention
    import taser.models.dropout as dropout

    library = attention.chunked_dropout_attention, dropout._MaskedDropout
    model = torch.nn.Sequential(torch.nn.Dropout(0.1))
    with levers.LEVERS["library at e72d41c"](model):
        assert attention.chunked_dropout_attention is not library[0] and dropout._MaskedDropout is not library[1]
    assert (attention.chunked_dropout_attention, dropout._MaskedDropout) == library


def test_attention_kernels_benchmark_runs_and_times_the_three_settings():
    import subprocess

    cmd = [sys.executable, str(ROOT / "benchmarks" / "peers" / "attention_kernels.py"), "--shape", "2", "2", "12", "4", "--rounds", "2"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT).stdout
    rows = [line for line in out.splitlines() if line.startswith("| taser") or line.startswith("| torch")]
    assert [row.split(" | ")[0] for row in rows] == ["| taser chunked, dropout", "| torch math, dropout", "| torch SDPA, no dropout"]
    assert rows[0].endswith("| 1.00x |")
