"""TASER's specialisation settings: which blocks get experts, what is specialised, how it routes.

The settings are a plain dict (the `taser` block of a bi-encoder's config, saved in its
`config.json`). `TaserConfig.resolve` validates it, fills the defaults and computes the layout,
so that a saved checkpoint rebuilds exactly the same modules.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from taser.choice import Choice


class Specialize(Choice):
    ffn = "ffn"
    attention = "attention"


class Routing(Choice):
    deterministic = "deterministic"  # questions to expert 0, passages to expert 1
    learned_sequence = "learned_sequence"  # a gate on [CLS] picks one expert per input
    learned_token = "learned_token"  # a gate picks one expert per token


def layout(num_layers: int, specialize_every: int) -> list[int]:
    """Blocks (0-indexed) specialised by the rule "T shared blocks, then one specialised".

    The bottom block is shared: T=2 on 12 blocks gives [2, 5, 8, 11], on 6 blocks [2, 5].
    """
    period = specialize_every + 1
    return [i for i in range(num_layers) if (i + 1) % period == 0]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass
class TaserConfig:
    specialize_every: int = 2
    specialized_layers: list[int] | None = None
    specialize: Specialize = Specialize.ffn
    routing: Routing = Routing.deterministic
    num_experts: int = 2
    shared_gate: bool = False
    gumbel_tau: float = 1.0
    load_balance_weight: float = 0.01
    entropy_weight: float = 0.0

    @property
    def learned(self) -> bool:
        return self.routing != "deterministic"

    @classmethod
    def from_dict(cls, settings: dict | None) -> TaserConfig:
        """The settings of a dict, unknown keys refused (not yet checked against an encoder)."""
        settings = dict(settings or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(settings) - known)
        if unknown:
            raise ValueError(f"unknown taser settings {unknown}; known: {sorted(known)}")
        return cls(**settings)

    @classmethod
    def resolve(cls, settings: dict | TaserConfig | None, num_layers: int) -> TaserConfig:
        """Validate `settings` against an encoder of `num_layers` blocks; raise ValueError if wrong."""
        cfg = cls.from_dict(asdict(settings) if isinstance(settings, TaserConfig) else settings)
        cfg._validate(num_layers)
        return cfg

    def _validate(self, num_layers: int) -> None:
        if not _is_int(self.specialize_every) or self.specialize_every < 1:
            raise ValueError(f"taser.specialize_every must be an integer >= 1, got {self.specialize_every!r}")
        if self.specialized_layers is None:
            layers = layout(num_layers, self.specialize_every)
            if not layers:
                raise ValueError(
                    f"taser.specialize_every={self.specialize_every} specialises no block of a "
                    f"{num_layers}-layer encoder; use a smaller value or list specialized_layers"
                )
        else:
            layers = self.specialized_layers
            if isinstance(layers, (str, bytes)) or not hasattr(layers, "__iter__"):
                raise ValueError(f"taser.specialized_layers must be a list of block indices, got {layers!r}")
            layers = list(layers)
            if not layers:
                raise ValueError("taser.specialized_layers is empty: list at least one block, or set it to null")
            bad = [i for i in layers if not _is_int(i) or not 0 <= i < num_layers]
            if bad:
                raise ValueError(f"taser.specialized_layers {bad} out of range: the encoder has blocks 0..{num_layers - 1}")
            if len(set(layers)) != len(layers):
                raise ValueError(f"taser.specialized_layers has duplicates: {layers}")
            layers = sorted(layers)
        self.specialized_layers = layers

        self.specialize = Specialize.parse(self.specialize, "taser.specialize").value
        self.routing = Routing.parse(self.routing, "taser.routing").value
        if not _is_int(self.num_experts) or self.num_experts < 2:
            raise ValueError(f"taser.num_experts must be an integer >= 2, got {self.num_experts!r}")
        if self.routing == "deterministic" and self.num_experts != 2:
            raise ValueError(
                f"deterministic routing has one expert per input type (question, passage): "
                f"num_experts must be 2, got {self.num_experts}"
            )
        if not isinstance(self.shared_gate, bool):
            raise ValueError(f"taser.shared_gate must be true or false, got {self.shared_gate!r}")
        if not _is_number(self.gumbel_tau) or not self.gumbel_tau > 0:
            raise ValueError(f"taser.gumbel_tau must be a number > 0, got {self.gumbel_tau!r}")
        if not _is_number(self.load_balance_weight) or self.load_balance_weight < 0:
            raise ValueError(f"taser.load_balance_weight must be a number >= 0, got {self.load_balance_weight!r}")
        if not _is_number(self.entropy_weight):
            raise ValueError(f"taser.entropy_weight must be a number, got {self.entropy_weight!r}")
        self.gumbel_tau = float(self.gumbel_tau)
        self.load_balance_weight = float(self.load_balance_weight)
        self.entropy_weight = float(self.entropy_weight)

    def to_dict(self) -> dict:
        return asdict(self)
