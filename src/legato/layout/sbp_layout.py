"""Layouts: every op of a model part with DTensor-style placements on every mesh axis of a
strategy, and the collectives they imply.

A part (embedding, dense layer, MoE layer, LM head) is one or two *segments*; a segment
is a run of ops over one device-mesh view. Dense ops see the mesh ``dp x cp x tp``
(``tp_x x tp_y`` for 2-D TP); an MoE layer's expert ops see the same ranks regrouped as
``edp x ep x tp`` with ``edp * ep = dp * cp`` (expert parallelism folds over the data and
context ranks, as in Megatron-Core). Within a segment, a tensor keeps the placements of the
op that wrote it; when a later op needs other placements, the move costs the collectives
of :func:`~legato.layout.placements.redistribute_cost`. A tensor read first in a segment
enters it as that op declares (the two views agree on the tp axis and on bytes per rank).
"""

from __future__ import annotations

from dataclasses import dataclass

from legato.layout.errors import LayoutError
from legato.layout.graph import (
    NO_GRADIENT,
    Op,
    Sizes,
    attention_ops,
    embedding_ops,
    head_ops,
    mlp_ops,
    moe_ops,
    sizes,
)
from legato.layout.placements import (
    PARTIAL,
    REPLICATE,
    Collective,
    Placement,
    Shard,
    redistribute_cost,
)
from legato.layout.roles import signature
from legato.specs.model import ModelSpec
from legato.specs.strategy import Strategy, StrategyError

PARTS = ("embedding", "dense", "moe", "head")
Layout = dict[str, Placement]


@dataclass(frozen=True)
class Axis:
    name: str
    size: int
    role: str


@dataclass(frozen=True)
class PlacedOp:
    """An op with the placements (per mesh axis) of its inputs, weights and outputs."""

    op: Op
    inputs: tuple[tuple[str, Layout], ...]
    weights: tuple[tuple[str, Layout], ...]
    outputs: tuple[tuple[str, Layout], ...]


@dataclass(frozen=True)
class Segment:
    name: str
    axes: tuple[Axis, ...]
    ops: tuple[PlacedOp, ...]

    @property
    def axis_sizes(self) -> dict[str, int]:
        return {axis.name: axis.size for axis in self.axes}


@dataclass(frozen=True)
class PartLayout:
    """The layout of one model part under one strategy, for one micro-batch."""

    part: str
    strategy: Strategy
    segments: tuple[Segment, ...]
    sizes: Sizes


def _tp_axes(strategy: Strategy, moe: bool) -> list[Axis]:
    if strategy.tp_y > 1:
        return [Axis("tp_x", strategy.tp_x, "tp_x"), Axis("tp_y", strategy.tp_y, "tp_y")]
    if strategy.tp == 1:
        return []
    role = "tp_sp" if strategy.sp else "tp"
    if moe:
        role += "_etp" if strategy.etp == strategy.tp > 1 else "_moe"
    return [Axis("tp", strategy.tp, role)]


def dense_axes(strategy: Strategy) -> tuple[Axis, ...]:
    """Mesh axes of dense ops, outer to inner; axes of size 1 are left out."""
    axes = [Axis("dp", strategy.dp, "dp"), Axis("cp", strategy.cp, "cp")]
    return tuple(a for a in axes + _tp_axes(strategy, False) if a.size > 1)


def expert_axes(strategy: Strategy) -> tuple[Axis, ...]:
    """Mesh axes of an MoE layer's expert ops: ``edp x ep x tp``."""
    if strategy.tp_y > 1:
        raise LayoutError("2-D tensor parallelism (tp=AxB) has layouts for dense layers only")
    if strategy.etp not in (1, strategy.tp):
        raise LayoutError(f"layouts cover etp = 1 or etp = tp ({strategy.tp}), got {strategy.etp}")
    if strategy.folded_ep:
        raise LayoutError(
            f"layouts cover ep dividing dp*cp ({strategy.dp * strategy.cp}); ep={strategy.ep} "
            f"folded over tensor-parallel ranks is priced by the cost model only"
        )
    edp = strategy.expert_dp
    axes = [Axis("edp", edp, "edp"), Axis("ep", strategy.ep, "ep")]
    return tuple(a for a in axes + _tp_axes(strategy, True) if a.size > 1)


def _place(op: Op, axes: tuple[Axis, ...]) -> PlacedOp:
    per_axis = {
        a.name: signature(a.role, op.kind, len(op.inputs), len(op.weights), len(op.outputs))
        for a in axes
    }

    def layouts(names: tuple[str, ...], which: int) -> tuple[tuple[str, Layout], ...]:
        return tuple(
            (name, {axis: sig[which][i] for axis, sig in per_axis.items()})
            for i, name in enumerate(names)
        )

    return PlacedOp(op, layouts(op.inputs, 0), layouts(op.weights, 1), layouts(op.outputs, 2))


def _segment(name: str, ops: list[Op], axes: tuple[Axis, ...]) -> Segment:
    return Segment(name, axes, tuple(_place(op, axes) for op in ops))


def part_layout(model: ModelSpec, strategy: Strategy, part: str) -> PartLayout:
    """Layout of ``part`` (one of :data:`PARTS`) of ``model`` under ``strategy``.

    The degree that splits attention heads (``tp``, or ``tp_y`` in 2-D, where ``tp_x``
    splits the sequence instead) must divide the heads and KV heads (StrategyError). Of
    the strategy it reads dp, cp, tp, tp_y, sp, ep, etp, mbs and dtype only
    (``cost.layer`` caches the collectives on them)."""
    heads_split = strategy.tp_y if strategy.tp_y > 1 else strategy.tp
    for name in ("num_heads", "num_kv_heads"):
        if getattr(model, name) % heads_split:
            raise StrategyError(
                f"strategy: the head-splitting tp degree ({heads_split}) must divide "
                f"{name} ({getattr(model, name)})"
            )
    swiglu = model.mlp == "swiglu"
    dense = dense_axes(strategy)
    if part == "embedding":
        segments = [_segment(part, embedding_ops(), dense)]
    elif part == "head":
        segments = [_segment(part, head_ops(model.tied_embeddings), dense)]
    elif part == "dense":
        segments = [_segment(part, attention_ops() + mlp_ops(swiglu), dense)]
    elif part == "moe":
        if model.moe is None:
            raise LayoutError(f"model {model.name} has no MoE layers")
        shared = model.moe.num_shared_experts > 0
        segments = [
            _segment("attention", attention_ops(), dense),
            _segment("moe", moe_ops(swiglu, shared), expert_axes(strategy)),
        ]
    else:
        raise LayoutError(f"unknown model part {part!r}; known: {', '.join(PARTS)}")
    act_bytes = 4 if strategy.dtype == "fp32" else 2
    return PartLayout(
        part, strategy, tuple(segments), sizes(model, strategy.mbs * strategy.dp, act_bytes)
    )


@dataclass(frozen=True)
class _Read:
    """An op reading a tensor: its placements before (None: first read in the segment)
    and as the op wants them, whether the producer set them (no redistribution since)."""

    segment: Segment
    op: PlacedOp
    tensor: str
    before: Layout | None
    wanted: Layout
    native: frozenset[str]  # axes whose placement the producer wrote


def _reads(layout: PartLayout) -> list[_Read]:
    reads = []
    for segment in layout.segments:
        current: dict[str, Layout] = {}
        native: dict[str, frozenset[str]] = {}
        for placed in segment.ops:
            for name, wanted in placed.inputs:
                before = current.get(name)
                axes = native.get(name, frozenset(wanted))
                reads.append(_Read(segment, placed, name, before, wanted, axes))
                if before is not None:
                    moved = {a for a in segment.axis_sizes if before.get(a) != wanted.get(a)}
                    native[name] = axes - moved
                current[name] = wanted
            for name, where in placed.outputs:
                current[name] = where
                native[name] = frozenset(segment.axis_sizes)
    return reads


def forward_collectives(layout: PartLayout) -> list[Collective]:
    """Collectives of one forward pass of the part over one micro-batch, in order."""
    out: list[Collective] = []
    for r in _reads(layout):
        if r.before is not None and r.before != r.wanted:
            nbytes = layout.sizes.activation_bytes[r.tensor]
            out += redistribute_cost(nbytes, r.before, r.wanted, r.segment.axis_sizes, r.tensor)
    return out


def _splits(placed: PlacedOp, axis: str) -> bool:
    """Whether the op divides its work over ``axis`` (anything it touches is not B)."""
    tensors = placed.inputs + placed.weights + placed.outputs
    return any(where.get(axis, REPLICATE) != REPLICATE for _, where in tensors)


@dataclass(frozen=True)
class GradRead:
    """The backward of one read: the gradient arrives from ``op`` with placements
    ``arrives`` and must leave with ``leaves`` (the dual of the placements before it)."""

    op: str
    tensor: str
    arrives: Layout
    leaves: Layout


def _reused_partial(reads: list[_Read], index: int, axis: str) -> bool:
    """Whether a later read reuses the copy that read ``index`` redistributed on ``axis``
    and divides its work over the axis: its partial gradient accumulates in that copy."""
    r = reads[index]
    for later in reads[index + 1 :]:
        if later.segment is not r.segment or later.tensor != r.tensor:
            continue
        if later.before is None or later.before.get(axis) != later.wanted.get(axis):
            return False  # moved again: that read converts its own gradient
        if _splits(later.op, axis):
            return True
    return False


def read_gradients(layout: PartLayout) -> list[GradRead]:
    """Gradient placements of every read, in forward order (see backward_collectives).
    At a redistribution to B, ``arrives`` is P when the op or a later reader of the
    redistributed copy divides its work over the axis (their gradients add up there)."""
    out = []
    reads = _reads(layout)
    for i, r in enumerate(reads):
        arrives, leaves = {}, {}
        for axis in r.segment.axis_sizes:
            wanted = r.wanted.get(axis, REPLICATE)
            before = wanted if r.before is None else r.before.get(axis, REPLICATE)
            split = _splits(r.op, axis)
            if before != wanted == REPLICATE and not split:
                split = _reused_partial(reads, i, axis)
            arrives[axis] = _grad(wanted, split)
            if before == wanted == REPLICATE and axis not in r.native:
                leaves[axis] = arrives[axis]  # reduced where it was redistributed
            else:
                leaves[axis] = _grad(before, False)
        out.append(GradRead(r.op.op.name, r.tensor, arrives, leaves))
    return out


def backward_collectives(layout: PartLayout, *, fused: bool = True) -> list[Collective]:
    """Collectives of one backward pass, in order: gradients flow back through every
    read, from the op's gradient placements to the tensor's placements before the read.

    The gradient of a placement: S(d) stays S(d); P becomes B (every summand needs the
    whole gradient); B becomes P when the reading op divides its work over the axis
    (each rank holds its part's contribution), else stays B. Gradients of a tensor that
    was redistributed before the read accumulate in that layout and are converted once,
    at the redistribution; a replicated tensor read as its producer wrote it is reduced
    at the read: once per op (``fused``: Megatron's fused QKV and gate/up GEMMs), or once
    per weight (``fused=False``: one ``nn.Linear`` per projection, as the reference block
    under ``parallelize_module``). Integer inputs (token ids) have no gradient."""
    out: list[Collective] = []
    reads = _reads(layout)
    for r, g in zip(reversed(reads), reversed(read_gradients(layout)), strict=True):
        if r.tensor in NO_GRADIENT:
            continue
        nbytes = layout.sizes.activation_bytes[r.tensor]
        sizes = r.segment.axis_sizes
        for move in redistribute_cost(nbytes, g.arrives, g.leaves, sizes, r.tensor):
            moved = r.before is not None and r.before.get(move.axis) != r.wanted.get(move.axis)
            out += [move] * (1 if fused or moved else max(1, len(r.op.weights)))
    return out


def _grad(p: Placement, split: bool) -> Placement:
    if isinstance(p, Shard):
        return p
    if p == REPLICATE:
        return PARTIAL if split else REPLICATE
    return REPLICATE
