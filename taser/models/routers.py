"""Routing: which expert handles an input, and the auxiliary losses on that decision.

- Deterministic routing (TASER's default) needs no parameters: questions go to expert 0,
  passages to expert 1 (`SIDE_EXPERT`); the input type comes from `RoutingState.side`.
- Learned routing uses a `LearnedRouter` (a linear gate) over the routed unit's state: the
  `[CLS]` state for one decision per input, each token's state for one decision per token.
  Training samples a hard choice with Gumbel-softmax (straight-through gradient); inference
  takes the argmax of the gate's logits.

`RoutingState` is the per-encoder context the mixture-of-experts modules share: the input type
being encoded, the token mask of the current batch, and the auxiliary losses accumulated since
the trainer last collected them.
"""

from __future__ import annotations

from dataclasses import dataclass

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
    """Routing losses accumulated over forward passes.

    `total` is the weighted sum that goes into the training objective (differentiable);
    `parts` holds the unweighted values (`load_balance`, `entropy`) for logging.
    """

    total: torch.Tensor
    parts: dict[str, float]


class RoutingState:
    """What the specialised modules of one encoder share while it encodes.

    Auxiliary losses are recorded only by forward passes run with autograd enabled (a pass
    under `torch.no_grad()` -- evaluation, the first pass of a gradient cache -- cannot feed a
    loss), as running sums, and averaged over every (specialised layer, forward pass) record at
    `collect()`: the weight does not scale with the number of specialised layers or of passes.
    """

    def __init__(self, learned: bool, load_balance_weight: float = 0.0, entropy_weight: float = 0.0):
        self.learned = learned  # False under deterministic routing: nothing to record or collect
        self.load_balance_weight = load_balance_weight
        self.entropy_weight = entropy_weight
        self.side: str | None = None
        self.token_mask: torch.Tensor | None = None  # (B, T) of the current batch, when known
        self._reset()

    def _reset(self) -> None:
        self._total: torch.Tensor | None = None
        self._parts: dict[str, torch.Tensor] = {}
        self._count = 0

    def mask_for(self, shape: torch.Size) -> torch.Tensor | None:
        """The current token mask flattened to (B*T,) bool, if it matches `shape` (B, T)."""
        mask = self.token_mask
        if mask is None or tuple(mask.shape) != tuple(shape):
            return None
        return mask.reshape(-1).bool()

    def record(self, routing: Routing, mask: torch.Tensor | None = None) -> None:
        if not torch.is_grad_enabled():
            return
        logits, choice = routing.logits, routing.choice
        if mask is not None:
            logits, choice = logits[mask], choice[mask]
        if choice.numel() == 0:
            return
        parts = {"load_balance": load_balance_loss(logits, choice), "entropy": router_entropy(logits)}
        total = self.load_balance_weight * parts["load_balance"] + self.entropy_weight * parts["entropy"]
        self._total = total if self._total is None else self._total + total
        for name, value in parts.items():
            value = value.detach()
            self._parts[name] = value if name not in self._parts else self._parts[name] + value
        self._count += 1

    def collect(self) -> AuxLoss | None:
        """The mean of the records since the last call (then cleared); None if there were none."""
        if self._count == 0:
            return None
        count = self._count
        aux = AuxLoss(self._total / count, {name: float(value) / count for name, value in self._parts.items()})
        self._reset()
        return aux
