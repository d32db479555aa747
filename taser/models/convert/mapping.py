"""Tensors of a foreign state dict matched to a model's by name: completely, or not at all.

A conversion names, for every tensor of the model, the tensor of the file that holds it. The
mapping is accepted only when each of the model's tensors is found with its shape and each of
the file's tensors is used; otherwise `ConversionError` names the file and the tensors that are
missing, left over, or of another shape. Two buffers some files carry are not weights and are
dropped when they hold their fixed values: `embeddings.position_ids` (0, 1, ..., n-1) and
`embeddings.token_type_ids` (zeros).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import torch

SHOWN = 8  # names listed per kind of mismatch; the count is always given


class ConversionError(ValueError):
    """A file that cannot be converted: the message names it and what is wrong."""


def listing(names: Iterable[str], shown: int = SHOWN) -> str:
    names = sorted(names)
    head = ", ".join(names[:shown])
    return head + (f", ... ({len(names) - shown} more)" if len(names) > shown else "")


def is_fixed_buffer(name: str, tensor: torch.Tensor) -> bool:
    """A buffer that carries no weights, holding its fixed value."""
    if name.endswith("embeddings.position_ids"):
        return torch.equal(tensor.flatten().long(), torch.arange(tensor.numel()))
    if name.endswith("embeddings.token_type_ids"):
        return not bool(tensor.any())
    return False


def _prefixes(names: Iterable[str]) -> str:
    return ", ".join(sorted({n.split(".", 1)[0] + "." for n in names}))


def gather(
    source: Mapping[str, torch.Tensor],
    names: Mapping[str, str],
    shapes: Mapping[str, torch.Size],
    where: str,
    optional: Callable[[str], bool] = lambda name: False,
) -> dict[str, torch.Tensor]:
    """The model's tensors, taken from `source` by `names` (model name -> file name).

    `shapes` gives each model tensor's shape; a model tensor for which `optional(name)` holds
    may be absent from the file (it is then absent from the result, for the caller to fill).
    Raises ConversionError naming `where` unless every other tensor is found with its shape and
    every tensor of `source` is used (fixed buffers aside).
    """
    missing = [theirs for ours, theirs in names.items() if theirs not in source and not optional(ours)]
    used = set(names.values())
    unexpected = [n for n, t in source.items() if n not in used and not is_fixed_buffer(n, t)]
    misshapen = [
        f"{theirs} {tuple(source[theirs].shape)} (model: {tuple(shapes[ours])})"
        for ours, theirs in names.items()
        if theirs in source and tuple(source[theirs].shape) != tuple(shapes[ours])
    ]
    if missing or unexpected or misshapen:
        problems = []
        if missing:
            problems.append(f"{len(missing)} missing: {listing(missing)}")
        if unexpected:
            problems.append(f"{len(unexpected)} unexpected: {listing(unexpected)}")
        if misshapen:
            problems.append(f"{len(misshapen)} of another shape: {listing(misshapen)}")
        found = f" (its tensors start with {_prefixes(source)})" if source else " (it holds no tensors)"
        raise ConversionError(f"{where}: the tensors do not map onto the model; " + "; ".join(problems) + found)
    return {ours: source[theirs] for ours, theirs in names.items() if theirs in source}
