"""Closed sets of settings (precision, similarity, routing, ...) as enums that read as strings.

Hydra's structured configs reject any other value at composition, naming the key and the
allowed values. Members equal their string (`Similarity.dot == "dot"`), print as it, and are
written to JSON as it, so code and files that hold plain strings keep working.
"""

from __future__ import annotations

from enum import Enum


class Choice(str, Enum):
    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    @classmethod
    def parse(cls, value, what: str):
        """`value` as a member, or ValueError naming `what` and the allowed values."""
        try:
            return cls(value)
        except ValueError:
            raise ValueError(f"unknown {what} {value!r}; expected one of {', '.join(cls.names())}") from None

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(m.value for m in cls)
