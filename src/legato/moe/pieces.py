"""Dropless permutation and its decomposition into pieces that travel and compute apart.

Every routed slot (token t, choice j) is kept: slots are sorted by expert (stable
argsort), so each expert's rows are contiguous and rows bound for the same EP rank are
too. A schedule cuts this sorted buffer into *pieces*; a piece is sent with one
all-to-all (or not at all when its rows stay on this rank), computed, and sent back:

* ``whole``: one piece, every row (plain all-to-all, or no EP);
* ``token_chunks``: the rows of consecutive token ranges (Domino-EP: two halves);
* ``local_then_chunks``: rows for this rank's own experts first, with no communication,
  then the remote rows cut into chunks, every expert's rows split evenly across chunks
  (Comet's token-wise decomposition: work starts on whatever has arrived).

The receiver of a piece gets rows ordered by source rank, then expert; grouped GEMMs
need them by expert: :func:`expert_major_order` gives that row order.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class SortedSlots:
    """Routed slots sorted by expert: token, weight and global expert of each row."""

    token_ids: Tensor
    weights: Tensor
    experts: Tensor
    counts: Tensor  # [E] rows per expert


@dataclass
class Piece:
    """A subset of the sorted rows (``rows`` positions, ascending; ``None``: all of them)
    with ``counts`` [E] rows per expert; ``local`` pieces never leave this rank."""

    rows: Tensor | None
    counts: Tensor
    local: bool


def sort_slots(indices: Tensor, weights: Tensor, num_experts: int, counts: Tensor) -> SortedSlots:
    """Sort the [T, k] routing ``indices``/``weights`` (``counts`` = bincount) by expert."""
    slot_experts = indices.reshape(-1)
    order = slot_experts.argsort(stable=True)
    top_k = indices.shape[-1]
    return SortedSlots(order // top_k, weights.reshape(-1)[order], slot_experts[order], counts)


def whole(slots: SortedSlots, local: bool) -> list[Piece]:
    return [Piece(None, slots.counts, local)]


def token_chunks(slots: SortedSlots, num_tokens: int, chunks: int, local: bool) -> list[Piece]:
    """Rows of tokens ``[c*T/chunks, (c+1)*T/chunks)`` for each chunk c."""
    chunk_of_row = slots.token_ids * chunks // max(num_tokens, 1)
    return [_select(slots, chunk_of_row == c, local) for c in range(chunks)]


def local_then_chunks(
    slots: SortedSlots, rank: int, experts_per_rank: int, chunks: int
) -> list[Piece]:
    """This rank's own rows (local), then the other ranks' rows in ``chunks`` pieces."""
    owner = slots.experts // experts_per_rank
    counts = slots.counts.index_select(0, slots.experts)
    first = torch.cumsum(slots.counts, 0) - slots.counts
    position = torch.arange(len(owner), device=owner.device) - first.index_select(0, slots.experts)
    chunk_of_row = position * chunks // counts.clamp(min=1)
    remote = owner != rank
    pieces = [_select(slots, ~remote, local=True)]
    pieces += [_select(slots, remote & (chunk_of_row == c), local=False) for c in range(chunks)]
    return pieces


def _select(slots: SortedSlots, mask: Tensor, local: bool) -> Piece:
    rows = mask.nonzero().squeeze(1)
    counts = torch.bincount(slots.experts[rows], minlength=len(slots.counts))
    return Piece(rows, counts, local)


def expert_major_order(sizes: list[list[int]], device: torch.device) -> Tensor | None:
    """Rows of a buffer laid out ``[source][expert]`` (``sizes[s][e]`` rows each), listed
    in ``[expert][source]`` order; ``None`` for a single source. The answer depends on
    the layout's shape only, never on the counts, so every rank builds the same autograd
    graph and issues backward collectives in the same order."""
    if len(sizes) == 1:
        return None
    table = torch.tensor(sizes, dtype=torch.int64)
    starts = (table.flatten().cumsum(0) - table.flatten()).view_as(table)
    seg_sizes = table.t().flatten()
    seg_starts = starts.t().flatten()
    out_starts = seg_sizes.cumsum(0) - seg_sizes
    total = int(seg_sizes.sum())
    shift = (seg_starts - out_starts).repeat_interleave(seg_sizes, output_size=total)
    return (torch.arange(total) + shift).to(device)


def inverse(order: Tensor) -> Tensor:
    """The permutation that undoes ``x.index_select(0, order)``."""
    result = torch.empty_like(order)
    result[order] = torch.arange(len(order), device=order.device)
    return result
