"""Routing: which expert handles an input, and the auxiliary losses on that decision.

- Deterministic routing (TASER's default) needs no parameters: questions go to expert 0,
  passages to expert 1 (`SIDE_EXPERT`); the input type comes from `RoutingContext.side`.
- Learned routing uses a `LearnedRouter` (a linear gate) over the routed unit's state: the
  `[CLS]` state for one decision per input, each token's state for one decision per token.
  Training samples a hard choice with Gumbel-softmax (straight-through gradient); inference
  takes the argmax of the gate's logits.

A `RoutingContext` travels with each forward pass (an argument, not module state): the input
type, the token mask, and the decisions of the learned routers, from which `aux_loss` computes
the auxiliary losses that the bi-encoder returns with the vectors.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

SIDE_EXPERT = {"question": 0, "passage": 1}


@dataclass
class Routing:
    """One decision per routed unit (row or token)."""

    choice: torch.Tensor  # (N,) long: the chosen expert
    gate: torch.Tensor | None  # (N,) equal to 1 in value, carries the gate's gradient; None at inference
    logits: torch.Tensor  # (N, E) float32 gate logits (no noise)


class LearnedRouter(nn.Module):
    """A linear gate hidden -> num_experts with a hard choice per unit.

    In training the choice is the argmax of Gumbel-perturbed logits (a sample of the softmax)
    and `gate` is `1 + p - p.detach()` with `p` the chosen expert's Gumbel-softmax probability at
    temperature `tau`: exactly 1 in the forward pass, so the chosen expert's output is unchanged,
    and the straight-through gradient of the hard one-hot sample in the backward pass. In
    evaluation (`training` False) the choice is the argmax of the logits and there is no gate.
    """

    def __init__(self, hidden_size: int, num_experts: int, tau: float = 1.0, init_std: float = 0.02):
        super().__init__()
        self.proj = nn.Linear(hidden_size, num_experts)
        self.tau = tau
        nn.init.normal_(self.proj.weight, std=init_std)
        nn.init.zeros_(self.proj.bias)

    @property
    def num_experts(self) -> int:
        return self.proj.out_features

    def forward(self, units: torch.Tensor) -> Routing:
        logits = self.proj(units).float()
        if not self.training:
            return Routing(logits.argmax(-1), None, logits)
        gumbel = -torch.empty_like(logits).exponential_().log()
        noisy = (logits + gumbel) / self.tau
        choice = noisy.argmax(-1)
        picked = noisy.softmax(-1).gather(-1, choice.unsqueeze(-1)).squeeze(-1)
        return Routing(choice, 1.0 + picked - picked.detach(), logits)


def load_balance_loss(logits: torch.Tensor, choice: torch.Tensor) -> torch.Tensor:
    """Switch Transformer's loss: E * sum_e (fraction of units routed to e) * (mean prob of e).

    1 when the load and the probabilities are uniform, up to E when everything goes to one
    expert with certainty; differentiable through the mean probabilities only.
    """
    num_experts = logits.shape[-1]
    fraction = torch.bincount(choice, minlength=num_experts).to(logits.dtype) / choice.numel()
    return num_experts * (fraction * logits.softmax(-1).mean(0)).sum()


def router_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Mean entropy (nats) of the gate's distribution over experts, per routed unit.

    Added to the objective with `entropy_weight`: a positive weight lowers the entropy, pushing
    each decision to be confident; a negative weight raises it (softer, more exploratory gates).
    """
    log_probs = logits.log_softmax(-1)
    return -(log_probs.exp() * log_probs).sum(-1).mean()


@dataclass
class AuxLoss:
    """Routing losses of one forward pass (or several, averaged).

    `total` is the weighted sum that goes into the training objective (differentiable where
    the pass ran with autograd); `parts` holds the unweighted values (`load_balance`, `entropy`)
    as detached 0-dim tensors on the device, read only when logged (no host sync per pass).
    """

    total: torch.Tensor
    parts: dict[str, torch.Tensor]


@dataclass
class RouterRecord:
    """What one learned router decided in one forward pass (padding tokens left out)."""

    logits: torch.Tensor  # (N, E) float32
    choice: torch.Tensor  # (N,)


@dataclass
class RoutingContext:
    """What a TASER encoder routes by in one forward pass, and what its routers decided.

    The bi-encoder makes one per pass and hands it to the encoder as the keyword argument
    `taser_routing`, which the Hugging Face model passes down to every block: deterministic
    experts read `side`; learned ones read `token_mask` and `shared_gate` and append their
    decisions to `records`. The bi-encoder returns the records and their loss with the vectors.
    """

    side: str
    token_mask: torch.Tensor | None = None  # (B, T) of this batch
    shared_gate: LearnedRouter | None = None  # the encoder's gate when all layers share one
    records: list[RouterRecord] = field(default_factory=list)

    def __post_init__(self):
        if self.side not in SIDE_EXPERT:
            raise ValueError(f"input type must be one of {tuple(SIDE_EXPERT)}, got {self.side!r}")

    def flat_mask(self, shape: torch.Size) -> torch.Tensor | None:
        """The token mask flattened to (B*T,) bool, if it matches `shape` (B, T)."""
        mask = self.token_mask
        if mask is None or tuple(mask.shape) != tuple(shape):
            return None
        return mask.reshape(-1).bool()

    def record(self, routing: Routing, mask: torch.Tensor | None = None) -> None:
        logits, choice = routing.logits, routing.choice
        if mask is not None:
            logits, choice = logits[mask], choice[mask]
        if choice.numel():
            self.records.append(RouterRecord(logits, choice))


def aux_loss(records: list[RouterRecord], load_balance_weight: float, entropy_weight: float) -> AuxLoss | None:
    """The weighted routing loss averaged over `records` (every layer of every pass counts once,
    so the weight does not scale with the number of specialised layers); None without records."""
    if not records:
        return None
    load_balance = torch.stack([load_balance_loss(r.logits, r.choice) for r in records]).mean()
    entropy = torch.stack([router_entropy(r.logits) for r in records]).mean()
    total = load_balance_weight * load_balance + entropy_weight * entropy
    return AuxLoss(total, {"load_balance": load_balance.detach(), "entropy": entropy.detach()})
