"""The routing loss in a training step: with TASER's learned routing, the gradients a step leaves
equal those of `nll + routing loss`, computed here independently of `StepRunner` (the model's
routers observed through hooks, the routing loss written out from its definition); plain, with
gradient caching, and on 2 processes."""

import os

import pytest
import torch
import torch.multiprocessing as mp
from conftest import tiny_model_cfg

from taser.data.biencoder_json import BiEncoderJsonFile
from taser.models.loading import load_model
from taser.models.routers import LearnedRouter
from taser.training.batching import collate, example_rng, make_example
from taser.training.config import TrainConfig
from taser.training.distributed import destroy_distributed
from taser.training.loss import retrieval_loss
from taser.training.step import StepRunner

CPU = torch.device("cpu")
# large weights, so the routing term is far above the comparison tolerance
LOAD_BALANCE_WEIGHT, ENTROPY_WEIGHT = 1.0, 0.5


def routed_model(pretrained, routing="learned_sequence"):
    torch.manual_seed(0)  # the routers' initialisation
    taser = {"specialize_every": 1, "routing": routing, "load_balance_weight": LOAD_BALANCE_WEIGHT, "entropy_weight": ENTROPY_WEIGHT}
    model, _ = load_model(tiny_model_cfg(pretrained, "taser", dropout=0.0, taser=taser))
    model.train()
    return model


def loss_config(model):
    return TrainConfig(precision="fp32", device="cpu").loss_config(model.config)


def examples(data_dir, n):
    data = BiEncoderJsonFile(data_dir / "train.json")
    return [make_example(data[i], 1, 1, example_rng(0, 0, 0, i)) for i in range(n)]


class RouterTap:
    """What the model's learned routers decide, pass by pass (forward hooks on `LearnedRouter`)."""

    def __init__(self, model):
        self.decisions = []
        self.handles = [m.register_forward_hook(self._hook) for m in model.modules() if isinstance(m, LearnedRouter)]
        assert self.handles, "no learned router in the model"

    def _hook(self, module, args, routing):
        self.decisions.append((routing.logits, routing.choice))

    def routing_loss(self, model, forward):
        """`forward()`'s result and the weighted routing loss of its one pass, from the definitions:
        load balance E * sum_e fraction_e * mean_prob_e, and the gate's mean entropy, averaged over layers."""
        self.decisions = []
        out = forward()
        balance, entropy = [], []
        for logits, choice in self.decisions:
            probs = logits.softmax(-1)
            experts = logits.shape[-1]
            fraction = torch.stack([(choice == e).float().mean() for e in range(experts)])
            balance.append(experts * (fraction * probs.mean(0)).sum())
            entropy.append(-(probs * probs.log()).sum(-1).mean())
        cfg = model.config.taser
        aux = cfg["load_balance_weight"] * torch.stack(balance).mean() + cfg["entropy_weight"] * torch.stack(entropy).mean()
        torch.testing.assert_close(out.aux_loss.total, aux)  # the tap sees what the model counts
        return out, aux

    def close(self):
        for h in self.handles:
            h.remove()


def _rows(inputs, start, stop):
    return {k: v[start:stop] for k, v in inputs.items()}


def expected_grads(model, batches, seeds, loss_cfg, chunk=0):
    """{name: gradient} of nll / questions + routing loss, and of the nll term alone.

    `batches`: one per rank (the ranks' slices of one global batch, in rank order), each encoded
    after `torch.manual_seed(seed)` as that rank would (the routers' Gumbel noise); the routing
    loss is the mean of the ranks' (each the mean of its passes, or of its gradient-cache chunks).
    """
    tap = RouterTap(model)
    qs, ps, auxes = [], [], []
    try:
        for batch, seed in zip(batches, seeds):
            torch.manual_seed(seed)
            pieces = []
            for side, inputs in (("questions", batch.questions), ("passages", batch.passages)):
                n = len(inputs["input_ids"])
                size = chunk or n
                for start in range(0, n, size):
                    rows = _rows(inputs, start, start + size)
                    out, aux = tap.routing_loss(model, lambda rows=rows, side=side: model(**{side: rows}))
                    pieces.append((side, out, aux))
            qs.append(torch.cat([out.questions for side, out, _ in pieces if side == "questions"]))
            ps.append(torch.cat([out.passages for side, out, _ in pieces if side == "passages"]))
            auxes.append(torch.stack([aux for _, _, aux in pieces]).mean())
    finally:
        tap.close()
    q, p = torch.cat(qs), torch.cat(ps)
    positive_idx, owner, offset, q_offset = [], [], 0, 0
    for batch in batches:
        positive_idx.append(batch.positive_idx + offset)
        owner.append(batch.ctx_owner + q_offset)
        offset += len(batch.ctx_owner)
        q_offset += batch.size
    nll, _ = retrieval_loss(q, p, torch.cat(positive_idx), torch.cat(owner), loss_cfg)
    nll_term = nll.sum() / len(q)
    aux_term = torch.stack(auxes).mean()
    names, params = zip(*[(n, p) for n, p in model.named_parameters() if p.requires_grad])
    total = torch.autograd.grad(nll_term + aux_term, params, allow_unused=True, retain_graph=True)
    nll_only = torch.autograd.grad(nll_term, params, allow_unused=True)
    keep = lambda grads: {n: g for n, g in zip(names, grads) if g is not None}  # noqa: E731
    return keep(total), keep(nll_only)


def assert_gradients(actual, expected, nll_only, where):
    gate = [n for n in expected if ".router." in n or "taser_gate" in n]
    assert gate, "no gate parameter got a gradient"
    # the routing term is visible: the gates' gradients without it are far from the expected ones
    assert all(not torch.allclose(nll_only[n], expected[n], rtol=1e-2, atol=1e-4) for n in gate if n.endswith("weight"))
    missing = set(expected) - set(actual)
    assert not missing, f"{where}: no gradient for {sorted(missing)[:3]}"
    for n in gate + [n for n in expected if n not in gate]:  # the gates first: where the routing term acts directly
        torch.testing.assert_close(actual[n], expected[n], rtol=1e-4, atol=1e-6, msg=f"{where}: {n}")


def actual_grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("routing", ["learned_sequence", "learned_token"])
@pytest.mark.parametrize("chunk", [0, 4])
def test_learned_routing_step_gives_gradient_of_nll_plus_routing_loss(tiny_pretrained, tokenizer, mini_squad, routing, chunk):
    """Would catch a routing loss left out of the step (or mis-weighted), plain and with gradient caching."""
    model = routed_model(tiny_pretrained, routing)
    batch = collate(examples(mini_squad, 4), tokenizer, 32, 64)
    cfg = loss_config(model)
    expected, nll_only = expected_grads(model, [batch], [11], cfg, chunk=chunk)
    model.zero_grad(set_to_none=True)
    torch.manual_seed(11)
    stats = StepRunner(model, cfg, "fp32", CPU, grad_cache_chunk=chunk).run(batch, batch.size)
    assert set(stats.aux) == {"load_balance", "entropy"}
    assert_gradients(actual_grads(model), expected, nll_only, f"{routing} chunk={chunk}")


def _worker(rank, world, init_file, pretrained, data_dir, out_dir):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), TASER_DIST_INIT=f"file://{init_file}")
    from taser.models.biencoder import load_tokenizer
    from taser.training.distributed import data_parallel, init_distributed

    init_distributed("gloo")
    tokenizer = load_tokenizer(pretrained)
    model = routed_model(pretrained)
    batch = collate(examples(data_dir, 4)[rank * 2 : (rank + 1) * 2], tokenizer, 32, 64)
    runner = StepRunner(data_parallel(model, find_unused_parameters=True), loss_config(model), "fp32", CPU, world_size=world)
    torch.manual_seed(11 + rank)
    runner.run(batch, 4, rank * 2)
    if rank == 0:
        torch.save(actual_grads(model), out_dir / "grads.pt")
    torch.distributed.barrier()  # both ranks leave together: a rank tearing down while the other still saves has hung gloo's shutdown
    destroy_distributed()  # the library's teardown: cached subgroups first, never left to interpreter shutdown


@pytest.mark.slow
def test_learned_routing_on_two_ranks_sums_to_the_one_process_gradient(tmp_path, tiny_pretrained, tokenizer, mini_squad):
    """Would catch each rank's routing loss counted in full (no division by the world size) or left out under DDP."""
    mp.spawn(_worker, args=(2, tmp_path / "dist-init", tiny_pretrained, mini_squad, tmp_path), nprocs=2, join=True)
    model = routed_model(tiny_pretrained)
    everything = examples(mini_squad, 4)
    halves = [collate(everything[r * 2 : (r + 1) * 2], tokenizer, 32, 64) for r in range(2)]
    expected, nll_only = expected_grads(model, halves, [11, 12], loss_config(model))
    assert_gradients(torch.load(tmp_path / "grads.pt"), expected, nll_only, "2 ranks")
