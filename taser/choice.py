"""Settings: closed sets of values (precision, similarity, routing, ...) as enums that read as
strings, and settings dataclasses built from plain dicts.

Hydra's structured configs reject any other value at composition, naming the key and the
allowed values. Members equal their string (`Similarity.dot == "dot"`), print as it, and are
written to JSON as it, so code and files that hold plain strings keep working.
"""

from __future__ import annotations

from dataclasses import asdict, fields, is_dataclass
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


def settings_from(cls, value, what: str):
    """An instance of the settings dataclass `cls` from `value`: returned as it is when already
    one, else built from a dict (or another dataclass), refusing keys `cls` does not have."""
    if isinstance(value, cls):
        return value
    if is_dataclass(value):
        value = asdict(value)
    known = [f.name for f in fields(cls)]
    unknown = sorted(set(value) - set(known))
    if unknown:
        raise ValueError(f"unknown {what} settings {unknown}; known: {known}")
    return cls(**value)
