"""SBP placements (OneFlow's split / broadcast / partial) under DTensor's names, and what it
costs to move a tensor from one placement to another.

A tensor on an n-D device mesh has one placement per mesh axis: ``Shard(d)`` (split along
tensor dim ``d``, SBP's S(d)), ``Replicate()`` (every rank holds all of it, B) or
``Partial()`` (every rank holds a summand, P). These are plain dataclasses so that the
planner stays torch-free; ``legato.parallel`` maps them one to one onto
``torch.distributed.tensor`` placements.

Redistribution cost follows the table of docs/planner.md (after Hypertron, SC'25), per device, for a group
of ``p`` ranks holding a tensor of ``T`` bytes (the part of the logical tensor that the
group covers, i.e. divided by the shard factors of the *other* axes):

=============  ==============  =================
from -> to     collective      bytes per device
=============  ==============  =================
same           none            0
B -> S         local slice     0
S(i) -> S(j)   all-to-all      T (p-1) / p^2
S -> B         all-gather      T (p-1) / p
P -> S         reduce-scatter  T (p-1) / p
P -> B         all-reduce      2 T (p-1) / p
-> P           avoided         (an error)
=============  ==============  =================
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from legato.layout.errors import LayoutError


@dataclass(frozen=True)
class Shard:
    """Split along tensor dimension ``dim`` (SBP ``S(dim)``)."""

    dim: int

    def __str__(self) -> str:
        return f"S({self.dim})"


@dataclass(frozen=True)
class Replicate:
    """A full copy on every rank of the axis (SBP ``B``, broadcast)."""

    def __str__(self) -> str:
        return "B"


@dataclass(frozen=True)
class Partial:
    """Every rank holds a partial sum; the tensor is their sum (SBP ``P``)."""

    def __str__(self) -> str:
        return "P"


Placement = Shard | Replicate | Partial
REPLICATE = Replicate()
PARTIAL = Partial()
Layout = Mapping[str, Placement]  # mesh axis name -> placement; a missing axis is Replicate

COLLECTIVES = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all")
_TEXT = re.compile(r"^(?:S\((-?\d+)\)|B|P)$")


def placement(text: str) -> Placement:
    """``"S(1)"``, ``"B"`` or ``"P"`` as a placement (the notation of the layout tables)."""
    match = _TEXT.match(text.strip())
    if not match:
        raise LayoutError(f"placement must be S(<dim>), B or P, got {text!r}")
    if match.group(1) is not None:
        return Shard(int(match.group(1)))
    return REPLICATE if text.strip() == "B" else PARTIAL


@dataclass(frozen=True)
class Collective:
    """One collective on one mesh axis: ``bytes`` each device sends (the bandwidth term of
    the alpha-beta model); ``tensor`` names what moves, for explanations."""

    kind: str
    axis: str
    bytes: float
    tensor: str = ""

    def key(self) -> tuple[str, str, float]:
        """What a measurement can be compared with: kind, axis and bytes."""
        return (self.kind, self.axis, self.bytes)


def transition(src: Placement, dst: Placement) -> str | None:
    """The collective that moves one axis from ``src`` to ``dst`` (None: free)."""
    if src == dst or (src == REPLICATE and isinstance(dst, Shard)):
        return None
    if isinstance(dst, Partial):
        raise LayoutError(
            f"redistribution {src} -> P is avoided by the planner (no layout needs it)"
        )
    if isinstance(src, Shard):
        return "all-to-all" if isinstance(dst, Shard) else "all-gather"
    return "reduce-scatter" if isinstance(dst, Shard) else "all-reduce"


def collective_bytes(kind: str, tensor_bytes: float, p: int) -> float:
    """Bytes per device of ``kind`` over ``p`` ranks for a group tensor of ``tensor_bytes``."""
    if p <= 1:
        return 0.0
    share = tensor_bytes * (p - 1) / p
    if kind == "all-to-all":
        return share / p
    if kind == "all-reduce":
        return 2 * share
    if kind in ("all-gather", "reduce-scatter"):
        return share
    raise LayoutError(f"unknown collective {kind!r}; known: {', '.join(COLLECTIVES)}")


# Order in which axes are redistributed: those that shrink the local tensor first, gathers
# last, so every step moves as few bytes as possible.
_ORDER = {"reduce-scatter": 0, "all-to-all": 1, "all-reduce": 2, "all-gather": 3}


def _shard_factor(layout: Mapping[str, Placement], sizes: Mapping[str, int], skip: str) -> int:
    factor = 1
    for axis, size in sizes.items():
        if axis != skip and isinstance(layout.get(axis, REPLICATE), Shard):
            factor *= size
    return factor


def redistribute_cost(
    tensor_bytes: float,
    src: Layout,
    dst: Layout,
    axis_sizes: Mapping[str, int],
    tensor: str = "",
) -> list[Collective]:
    """Collectives (kind, axis, bytes per device) that move a tensor of ``tensor_bytes``
    (logical, whole-mesh size) from layout ``src`` to ``dst``, one axis at a time.

    Axes of size 1 never communicate. Each step's group tensor is ``tensor_bytes`` divided
    by the shard factors of the other axes at that moment (a partial axis does not shrink
    it). Free slices apply first, then steps that shrink the local tensor
    (reduce-scatter, all-to-all), then all-reduces and all-gathers; ties go in mesh order."""
    current = dict(src)
    steps = []
    for index, (axis, size) in enumerate(axis_sizes.items()):
        before, after = src.get(axis, REPLICATE), dst.get(axis, REPLICATE)
        kind = transition(before, after)
        if kind is None or size == 1:
            current[axis] = after  # slices are free and shrink what the others move
        else:
            steps.append((_ORDER[kind], index, axis, kind))
    out = []
    for _, _, axis, kind in sorted(steps):
        group_bytes = tensor_bytes / _shard_factor(current, axis_sizes, axis)
        nbytes = collective_bytes(kind, group_bytes, axis_sizes[axis])
        out.append(Collective(kind, axis, nbytes, tensor))
        current[axis] = dst.get(axis, REPLICATE)
    return out
