"""The routed-expert pipeline: dispatch, grouped GEMMs, combine, under three schedules.

* ``plain`` (torchtitan / Megatron all-to-all dispatcher): all-to-all every row, wait,
  grouped GEMMs, all-to-all back, wait. Nothing overlaps.
* ``domino`` (XTuner's Domino-EP): the tokens are cut into ``chunks`` ranges (two halves
  by default); all dispatches are issued at once, so chunk c+1 travels while chunk c is
  computed, and chunk c's combine travels while chunk c+1 is computed.
* ``comet`` (Comet, MLSys'25): rows for this rank's own experts are computed first with no
  communication while the remote rows travel in ``chunks`` asynchronous all-to-alls; each
  chunk's GEMMs start as soon as it has arrived. The second GEMM is cut into ``groups``
  column groups and each group's combine is issued before the next group is computed.

The schedules differ only in how rows are cut into pieces (``pieces``) and in the column
groups; every variant computes each output element with the same operations, so results
agree to rounding, and backward mirrors every transfer (``comm``). Chunk and group counts
are tunables; ``cost.moe_layer_time`` predicts the best ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise
from typing import Literal

import torch
from torch import Tensor

from legato.errors import ConfigError
from legato.moe import pieces as cut
from legato.moe.comm import (
    EPGroup,
    Transfer,
    exchange_counts,
    start_all_to_all,
    wait_all_to_all,
)
from legato.moe.experts import ExpertWeights, GroupedExperts, make_groups
from legato.moe.router import Routing

Schedule = Literal["plain", "domino", "comet"]
SCHEDULES = ("plain", "domino", "comet")


@dataclass(frozen=True)
class Overlap:
    """How one MoE layer overlaps communication with compute (see the module docstring)."""

    schedule: Schedule = "plain"
    chunks: int = 1
    groups: int = 1

    def __post_init__(self) -> None:
        if self.schedule not in SCHEDULES:
            raise ConfigError(
                f"moe.overlap.schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}"
            )
        for name in ("chunks", "groups"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"moe.overlap.{name} must be an integer >= 1, got {value!r}")
            if self.schedule == "plain" and value != 1:
                raise ConfigError(f"moe.overlap.{name} must be 1 for schedule 'plain', got {value}")

    @classmethod
    def domino(cls, chunks: int = 2, groups: int = 1) -> Overlap:
        return cls("domino", chunks, groups)

    @classmethod
    def comet(cls, chunks: int = 2, groups: int = 2) -> Overlap:
        return cls("comet", chunks, groups)


def column_slices(width: int, groups: int) -> list[slice]:
    """``groups`` near-equal column ranges of ``width``, on multiples of 8 when possible
    (16-byte aligned bf16 rows for the GPU grouped GEMM)."""
    groups = min(groups, width)
    unit = 8 if width % 8 == 0 and width >= 8 * groups else 1
    blocks = width // unit
    bounds = [unit * (blocks * g // groups) for g in range(groups + 1)]
    return [slice(a, b) for a, b in pairwise(bounds)]


def plan_pieces(
    slots: cut.SortedSlots, num_tokens: int, ep: EPGroup | None, overlap: Overlap
) -> list[cut.Piece]:
    local = ep is None
    if overlap.schedule == "domino":
        return cut.token_chunks(slots, num_tokens, overlap.chunks, local)
    if overlap.schedule == "comet" and ep is not None:
        per_rank = len(slots.counts) // ep.size
        return cut.local_then_chunks(slots, ep.rank, per_rank, overlap.chunks)
    return cut.whole(slots, local)


@dataclass
class _Route:
    """Where one piece's rows go: per-destination send splits, and what arrives here
    (``sources[s][e]`` rows from source s for local expert e)."""

    send: list[int]
    recv: list[int]
    sources: list[list[int]]


def _routes(pieces: list[cut.Piece], ep: EPGroup | None) -> list[_Route]:
    """Exchange row counts for all remote pieces at once (the one blocking step)."""
    ranks, rank = (1, 0) if ep is None else (ep.size, ep.rank)
    counts = torch.stack([p.counts for p in pieces])
    counts = counts.view(len(pieces), ranks, counts.shape[1] // ranks)
    received = counts.clone()
    remote = [i for i, p in enumerate(pieces) if not p.local]
    if remote:
        received[remote] = exchange_counts(counts[remote], ep.group)
    sent, got = counts.tolist(), received.tolist()
    routes = []
    for piece, out, into in zip(pieces, sent, got, strict=True):
        sources = [out[rank]] if piece.local else into
        routes.append(_Route([sum(r) for r in out], [sum(r) for r in into], sources))
    return routes


_InFlight = tuple[Tensor, Transfer | None]  # rows, and the transfer still to wait for


@dataclass(frozen=True)
class _Sender:
    """Starts all-to-alls on ``group``; ``eager`` (plain) waits for each right away."""

    group: object
    eager: bool

    def send(self, rows: Tensor, splits: list[int], back: list[int]) -> _InFlight:
        buffer, transfer = start_all_to_all(rows, splits, back, self.group)
        return (wait_all_to_all(buffer, transfer), None) if self.eager else (buffer, transfer)


def _arrived(flight: _InFlight) -> Tensor:
    rows, transfer = flight
    return rows if transfer is None else wait_all_to_all(rows, transfer)


def _compute(
    flight: _InFlight,
    piece: cut.Piece,
    route: _Route,
    experts: GroupedExperts,
    weights: ExpertWeights,
    overlap: Overlap,
    sender: _Sender,
) -> list[_InFlight]:
    """One piece's GEMMs once its rows are here; each column group's result is sent back
    (started, not waited for) before the next group is computed."""
    rows = _arrived(flight)
    order = cut.expert_major_order(route.sources, rows.device)
    if order is not None:
        rows = rows.index_select(0, order)
        order = cut.inverse(order)
    groups = make_groups([sum(col) for col in zip(*route.sources, strict=True)], rows.device)
    hidden = experts.hidden(rows, groups, weights)
    outputs = []
    for columns in column_slices(rows.shape[-1], overlap.groups):
        y = experts.down(hidden, groups, weights, columns)
        y = y if order is None else y.index_select(0, order)
        outputs.append((y, None) if piece.local else sender.send(y, route.recv, route.send))
    return outputs


def routed_experts(
    x: Tensor,
    routing: Routing,
    experts: GroupedExperts,
    ep: EPGroup | None = None,
    overlap: Overlap = Overlap(),
) -> Tensor:
    """Dropless top-k expert output for tokens ``x`` [T, h] (weighted sum over choices).

    Experts compute in autocast's dtype when autocast is on (``torch._grouped_mm`` is not
    on its lists), else in ``x``'s dtype; the result has ``x``'s dtype."""
    device = x.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype
    slots = cut.sort_slots(routing.indices, routing.weights, len(routing.counts), routing.counts)
    pieces = plan_pieces(slots, x.shape[0], ep, overlap)
    routes = _routes(pieces, ep)
    weights = experts.local_weights(dtype)
    sender = _Sender(None if ep is None else ep.group, eager=overlap.schedule == "plain")

    sorted_x = x.index_select(0, slots.token_ids).to(dtype)
    flights = []  # every dispatch is started before any piece is computed
    for piece, route in zip(pieces, routes, strict=True):
        rows = sorted_x if piece.rows is None else sorted_x.index_select(0, piece.rows)
        flights.append((rows, None) if piece.local else sender.send(rows, route.send, route.recv))
    returns = [
        _compute(flight, piece, route, experts, weights, overlap, sender)
        for flight, piece, route in zip(flights, pieces, routes, strict=True)
    ]
    ys = [torch.cat([_arrived(out) for out in outputs], dim=1) for outputs in returns]

    if len(pieces) == 1 and pieces[0].rows is None:
        y, token_ids, slot_weights = ys[0], slots.token_ids, slots.weights
    else:
        rows = torch.cat([p.rows for p in pieces])
        y = torch.cat(ys)
        token_ids, slot_weights = slots.token_ids[rows], slots.weights[rows]
    weighted = (y * slot_weights.unsqueeze(-1).to(dtype)).to(x.dtype)
    return x.new_zeros(x.shape).index_add(0, token_ids, weighted)
