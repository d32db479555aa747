"""Padding-free encoding: a batch costs its real tokens, not batch x longest.

A padded batch (B, L) with N real tokens runs through the Hugging Face encoder as one packed
row (1, N): the real tokens' ids with their own position ids (0, 1, ... within each input,
offset as RoBERTa-style embeddings offset them). Embeddings, the Q/K/V and output projections,
the FFNs (and TASER's experts and routers) and every LayerNorm and dropout then run on the N
real tokens only. The one step that needs the inputs apart is the attention core,
softmax(q k^T) v: the `taser_sdpa` attention function (`taser.models.attention`) finds the
`PackedLayout` among its keyword arguments (`taser_packing`, handed to every block as
`taser_routing` is), scatters q, k and v into padded layouts, runs the padded path's kernel on
each, and gathers the real tokens' outputs back. Those layouts are length groups: the inputs
sorted by length and cut wherever one is shorter than a fraction (`GROUP_LENGTH_RATIO`) of its
group's longest, each group padded to its own longest (no mask at all when its inputs are
equally long; on CPU every group is one length, which measured fastest). So the linear layers,
about nine tenths of a BERT block's FLOPs at L=256, skip the padding, and so does the attention
core, whose cost grows with the square of the length (on CPU entirely; elsewhere mostly).

`encoder_states` returns the last hidden states in the padded (B, L, H) layout (zeros at the
pads), so pooling is unchanged. The vectors and gradients equal the padded path's to float
tolerance (tests/test_unpad.py); with dropout in training the masks are drawn over N tokens
instead of B x L (and attention dropout over the groups' shapes), so the two paths are equal in
distribution, not sample by sample.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

PACKING_KWARG = "taser_packing"
# An attention length group takes inputs down to this fraction of its longest, by device type. On
# CPU one call per distinct length, unmasked, measured fastest (benchmarks/peers/unpad_micro.md);
# elsewhere fewer, masked calls (GPUs: not measured yet).
GROUP_LENGTH_RATIO = {"cpu": 1.0}
OTHER_DEVICES_GROUP_RATIO = 0.8


def group_ratio_for(device: torch.device) -> float:
    return GROUP_LENGTH_RATIO.get(device.type, OTHER_DEVICES_GROUP_RATIO)


@dataclass(frozen=True)
class LengthGroup:
    """Inputs that share one padded attention call: `rows` inputs padded to `length`."""

    rows: int
    length: int
    mask: torch.Tensor | None  # (rows, 1, length, length) bool keep-mask; None when all fill `length`


def _length_groups(lengths: list[int], ratio: float) -> list[list[int]]:
    """Row indices by decreasing length, cut where a length falls below `ratio` x the group's first."""
    groups: list[list[int]] = []
    for row in sorted(range(len(lengths)), key=lambda r: -lengths[r]):
        if groups and lengths[row] >= ratio * lengths[groups[-1][0]]:
            groups[-1].append(row)
        else:
            groups.append([row])
    return groups


@dataclass(frozen=True)
class PackedLayout:
    """Where the N real tokens of a right-padded (B, L) batch sit, and how to move between layouts."""

    indices: torch.Tensor  # (N,) long: flat position b * L + t of each real token, in packed order (by group)
    row_ids: torch.Tensor  # (N,) long: the input (row) each real token belongs to
    starts: torch.Tensor  # (B,) long: packed index of each input's first token ([CLS])
    token_mask: torch.Tensor  # (B, L) bool: the real tokens
    groups: tuple[LengthGroup, ...]  # the attention core's padded calls
    # (N,) long: each real token's row in the groups' padded layouts, laid end to end; None when no
    # group is padded, and the packed tokens are those layouts already
    slots: torch.Tensor | None

    @classmethod
    def from_mask(cls, mask: torch.Tensor, group_ratio: float | None = None) -> PackedLayout:
        """The layout of a right-padded (B, L) 0/1 mask; every input needs at least one real token.
        `group_ratio`: None, the device's (`GROUP_LENGTH_RATIO`); 0 makes one group of the whole batch.

        The inputs are packed in their groups' order (longest first, ties in row order), so a group
        whose inputs all fill its length is a plain view of the packed tokens: no scatter, no pads."""
        mask = mask.bool()
        batch, length = mask.shape
        lengths = mask.sum(1)
        if batch and not bool((lengths > 0).all()):
            raise ValueError("padding-free encoding needs at least one real token per input (an all-padding row was given)")
        sizes = lengths.tolist()
        grouped = _length_groups(sizes, group_ratio_for(mask.device) if group_ratio is None else group_ratio)
        order = torch.tensor([row for rows in grouped for row in rows], dtype=torch.long, device=mask.device)
        in_order, positions = mask.index_select(0, order).nonzero(as_tuple=True)
        row_ids = order.index_select(0, in_order)
        indices = row_ids * length + positions
        ordered_lengths = lengths.index_select(0, order)
        starts = torch.empty_like(lengths)
        starts[order] = torch.cumsum(ordered_lengths, 0) - ordered_lengths

        groups, row_base, offset, aligned = [], [0] * batch, 0, True
        for rows in grouped:
            longest = sizes[rows[0]]
            for i, row in enumerate(rows):
                row_base[row] = offset + i * longest
            offset += len(rows) * longest
            keep = None
            if sizes[rows[-1]] < longest:
                aligned = False
                own = torch.tensor([sizes[r] for r in rows], device=mask.device)
                keep = (torch.arange(longest, device=mask.device) < own[:, None])[:, None, None, :].expand(len(rows), 1, longest, longest)
            groups.append(LengthGroup(len(rows), longest, keep))
        slots = None if aligned else torch.tensor(row_base, dtype=torch.long, device=mask.device).index_select(0, row_ids) + positions
        return cls(indices, row_ids, starts, mask, tuple(groups), slots)

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.token_mask.shape)

    @property
    def num_tokens(self) -> int:
        return self.indices.numel()

    def position_ids(self, offset: int = 0) -> torch.Tensor:
        """(N,) each real token's position within its input, plus `offset`."""
        positions = torch.cumsum(self.token_mask, 1) - 1
        return positions.reshape(-1).index_select(0, self.indices) + offset

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        """(B, L, ...) -> (N, ...): the real tokens' rows."""
        return x.reshape(-1, *x.shape[2:]).index_select(0, self.indices)

    def unpack(self, x: torch.Tensor) -> torch.Tensor:
        """(N, ...) -> (B, L, ...), zeros at the pads (differentiable in `x`)."""
        batch, length = self.shape
        out = x.new_zeros((batch * length, *x.shape[1:]))  # filled in place: no copy of the zeros
        return out.index_copy_(0, self.indices, x).view(batch, length, *x.shape[1:])

    def select_rows(self, rows: torch.Tensor) -> tuple[torch.Tensor, PackedLayout]:
        """The packed indices of the tokens of `rows` (ascending row indices) and their own layout."""
        chosen = torch.zeros(self.shape[0], dtype=torch.bool, device=self.row_ids.device)
        chosen[rows] = True
        tokens = chosen.index_select(0, self.row_ids).nonzero().squeeze(1)
        return tokens, PackedLayout.from_mask(self.token_mask.index_select(0, rows))

    # -- the attention core, padded by length group: q, k, v as transformers' attention functions get them
    def unpack_heads(self, x: torch.Tensor) -> list[torch.Tensor]:
        """(1, heads, N, d) -> one (rows, heads, length, d) per group, zeros at the pads."""
        tokens = x[0].transpose(0, 1)  # (N, heads, d)
        if self.slots is None:
            padded = tokens
        else:
            total = sum(g.rows * g.length for g in self.groups)
            padded = tokens.new_zeros((total, *tokens.shape[1:])).index_copy_(0, self.slots, tokens)
        parts = padded.split([g.rows * g.length for g in self.groups])
        return [p.view(g.rows, g.length, *tokens.shape[1:]).transpose(1, 2) for p, g in zip(parts, self.groups)]

    def pack_heads(self, outputs: list[torch.Tensor]) -> torch.Tensor:
        """One (rows, length, heads, d) attention output per group -> (1, N, heads, d)."""
        flat = [o.reshape(-1, *o.shape[2:]) for o in outputs]
        tokens = torch.cat(flat) if len(flat) > 1 else flat[0]
        return (tokens if self.slots is None else tokens.index_select(0, self.slots)).unsqueeze(0)


def position_offset(encoder: nn.Module) -> int:
    """Where an encoder's positions start: 0 for BERT, `padding_idx + 1` for RoBERTa-style embeddings."""
    embeddings = getattr(getattr(encoder, "base_model", encoder), "embeddings", None)
    padding_idx = getattr(embeddings, "padding_idx", None)
    return 0 if padding_idx is None else int(padding_idx) + 1


def padded_states(encoder: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, **kwargs) -> torch.Tensor:
    """The encoder run as usual on a padded batch: its last hidden states (B, L, H)."""
    return encoder(input_ids=input_ids, attention_mask=attention_mask, **kwargs).last_hidden_state


def encoder_states(encoder: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, unpad: bool, call=None, **kwargs) -> torch.Tensor:
    """The encoder's last hidden states (B, L, H) of a right-padded batch.

    With `unpad`, and padding present, the encoder runs on the real tokens only (see the module
    docstring; its attention implementation must be `taser_sdpa`) and the pads' states are zeros;
    else it runs as usual, padded, through `call` when given (a compiled `padded_states`, see
    `taser.training.compiled`). `kwargs` go to the encoder (e.g. `taser_routing`).
    """
    if call is not None:
        if unpad:
            raise ValueError("a compiled encoder call runs padded batches only (unpad must be off)")
        return call(encoder, input_ids, attention_mask, **kwargs)
    if not unpad or attention_mask is None or bool(attention_mask.bool().all()):
        return padded_states(encoder, input_ids, attention_mask, **kwargs)
    layout = PackedLayout.from_mask(attention_mask)
    packed = encoder(
        input_ids=layout.pack(input_ids).unsqueeze(0),
        position_ids=layout.position_ids(position_offset(encoder)).unsqueeze(0),
        **{PACKING_KWARG: layout},
        **kwargs,
    ).last_hidden_state
    return layout.unpack(packed[0])
