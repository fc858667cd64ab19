"""Schedule builders: GPipe, 1F1B, interleaved 1F1B, ZB-H1, ZB-2p, ZB-V, Seq1F1B, SVPP
and DualPipe.

Every builder returns a ``Schedule`` whose per-rank lists already contain the sends and
receives. Sizes: p = ``stages`` (ranks), m = ``microbatches``, v = ``chunks`` per rank,
k = ``slices`` per micro-batch. Rules for what is valid:

* all sizes are positive integers; m < p is allowed (the pipeline just never fills);
* interleaved needs v >= 2 and m % p == 0 (Megatron's rule: forwards go in rounds of p
  micro-batches per chunk);
* ZB-V has exactly 2 chunks in the V shape;
* DualPipe needs an even p and an even m >= 2p (the reference's rules);
* a memory cap (SVPP, ZB-V; in slice units per rank) must be at least the dependency
  floor v*k: a micro-batch's first backward on a rank needs all of its v*k forward
  units there, and nothing of it is freed before.

Fused-backward schedules (GPipe, 1F1B, interleaved, Seq1F1B) have fixed orders. ZB-H1 is
1F1B's order with the backward split and W passes filling the waits at 1F1B's memory
(p micro-batches). SVPP, ZB-V and ZB-2p are greedy (see ``engine``): backward first as
soon as its dependencies allow, then the oldest forward the memory cap admits, then W.
ZB-2p is Zero Bubble's schedule at twice 1F1B's memory (2p micro-batches): the extra
forwards fill the warm-up and the W passes the drain, leaving a bubble of
``(p - 1) max(f, f + b - 2w)`` (ZB-H2's, floored by the last rank's wait for its first
forward), against ZB-H1's ``(p - 1) max(f, f + b - w)``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any, Literal

from legato.schedule.costs import CostModel, Costs
from legato.schedule.dependencies import with_communication
from legato.schedule.engine import ListScheduler
from legato.schedule.errors import ScheduleError
from legato.schedule.ir import Schedule, StagePlacement
from legato.schedule.orders import (
    dualpipe_order,
    gpipe_order,
    interleaved_order,
    one_f_one_b_order,
)
from legato.schedule.slicing import slice_bounds
from legato.specs.schedules import SCHEDULE_KINDS, SCHEDULES, ScheduleKind

Slicing = Literal["equal-length", "equal-flops"]


def _positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ScheduleError(f"{name}: must be a positive integer, got {value!r}")
    return value


def memory_floor(chunks: int, slices: int) -> int:
    """Smallest per-rank cap (slice units) without deadlock: one micro-batch, v*k units."""
    return chunks * slices


def default_memory_cap(stages: int, chunks: int, slices: int) -> int:
    """SVPP's default cap: rank 0's in-flight depth in interleaved 1F1B ((v+1)p - 1
    chunk units; p for plain 1F1B when v = 1) plus the k - 1 extra slices of Seq1F1B.
    For v >= 2 this is the note's relative activation ((v+1)p + k - 2)/(v k p)."""
    p, v, k = stages, chunks, slices
    depth = p + k - 1 if v == 1 else (v + 1) * p + k - 2
    return max(memory_floor(v, k), depth)


def _check_cap(cap: float, chunks: int, slices: int) -> float:
    floor = memory_floor(chunks, slices)
    if not cap >= floor:
        raise ScheduleError(
            f"memory_cap: {cap:g} slice units is below the dependency floor "
            f"v*k = {chunks}*{slices} = {floor} for device 0"
        )
    return cap


def _bounds(slices: int, slicing: str, costs: Costs) -> tuple[float, ...]:
    if slicing not in ("equal-length", "equal-flops"):
        raise ScheduleError(f"slicing: must be equal-length or equal-flops, got {slicing!r}")
    return slice_bounds(slices, costs.attention_share if slicing == "equal-flops" else 0.0)


def _finish(template: Schedule, costs: Costs, **engine: Any) -> Schedule:
    plan = ListScheduler(template, costs, **engine).run()
    compute = [[a for a, _, _ in rank] for rank in plan]
    return replace(template, ranks=with_communication(template, compute))


def gpipe(stages: int, microbatches: int) -> Schedule:
    p, m = _positive("stages", stages), _positive("microbatches", microbatches)
    t = Schedule("gpipe", StagePlacement(p), m)
    return _finish(t, CostModel(), order=gpipe_order(p, m, "BW"))


def one_f_one_b(stages: int, microbatches: int) -> Schedule:
    p, m = _positive("stages", stages), _positive("microbatches", microbatches)
    t = Schedule("1f1b", StagePlacement(p), m)
    return _finish(t, CostModel(), order=one_f_one_b_order(p, m, 1, "BW"))


def interleaved(stages: int, microbatches: int, chunks: int = 2) -> Schedule:
    p, m, v = (_positive(n, x) for n, x in
               (("stages", stages), ("microbatches", microbatches), ("chunks", chunks)))  # fmt: skip
    if v < 2:
        raise ScheduleError(f"chunks: interleaved needs at least 2 per rank (1 is 1f1b), got {v}")
    if m % p:
        raise ScheduleError(f"microbatches: interleaved needs a multiple of stages ({p}), got {m}")
    t = Schedule("interleaved", StagePlacement(p, v), m)
    return _finish(t, CostModel(), order=interleaved_order(p, m, v, "BW"))


def seq1f1b(
    stages: int,
    microbatches: int,
    slices: int = 2,
    *,
    slicing: Slicing = "equal-length",
    costs: Costs | None = None,
) -> Schedule:
    """Slice-level 1F1B: k slices per micro-batch flow as separate units, fused backward."""
    p, m, k = (_positive(n, x) for n, x in
               (("stages", stages), ("microbatches", microbatches), ("slices", slices)))  # fmt: skip
    costs = costs or CostModel()
    t = Schedule("seq1f1b", StagePlacement(p), m, k, slice_bounds=_bounds(k, slicing, costs))
    return _finish(t, costs, order=one_f_one_b_order(p, m, k, "BW"))


def zb_h1(
    stages: int, microbatches: int, *, w_subtasks: int = 1, costs: Costs | None = None
) -> Schedule:
    """Zero Bubble H1: 1F1B's F/B order, W deferred into waits, at most p micro-batches."""
    p, m = _positive("stages", stages), _positive("microbatches", microbatches)
    g = _positive("w_subtasks", w_subtasks)
    t = Schedule("zb-h1", StagePlacement(p), m, backward="split", w_subtasks=g)
    order = one_f_one_b_order(p, m, 1, "B")
    return _finish(t, costs or CostModel(), order=order, cap=p, reserve=False)


def zb_2p(
    stages: int, microbatches: int, *, w_subtasks: int = 1, costs: Costs | None = None
) -> Schedule:
    """Zero Bubble at 2p micro-batches of memory: the greedy order under that cap."""
    p = _positive("stages", stages)
    return svpp(p, microbatches, 1, 1, memory_cap=2 * p, w_subtasks=w_subtasks, costs=costs,
                name="zb-2p")  # fmt: skip


def svpp(
    stages: int,
    microbatches: int,
    chunks: int = 2,
    slices: int = 2,
    *,
    memory_cap: float | None = None,
    w_subtasks: int = 1,
    slicing: Slicing = "equal-length",
    placement: Literal["interleaved", "v"] = "interleaved",
    costs: Costs | None = None,
    reserve: bool = True,
    name: str = "svpp",
) -> Schedule:
    """Slice-level virtual pipeline: k slices x v chunks x split W under a memory cap.

    ``memory_cap`` (slice units per rank) defaults to ``default_memory_cap``. Any cap
    >= v*k completes; a smaller one raises. ``reserve=False`` drops the capacity reservation for older micro-batches
    (only to show that plain greedy scheduling deadlocks at low caps).
    """
    p, m, v, k = (_positive(n, x) for n, x in (
        ("stages", stages), ("microbatches", microbatches), ("chunks", chunks), ("slices", slices)
    ))  # fmt: skip
    g = _positive("w_subtasks", w_subtasks)
    costs = costs or CostModel()
    if memory_cap is None:
        memory_cap = default_memory_cap(p, v, k)
    cap = _check_cap(memory_cap, v, k)
    t = Schedule(
        name, StagePlacement(p, v, placement), m, k, "split", g, _bounds(k, slicing, costs)
    )
    return _finish(t, costs, cap=cap, reserve=reserve)


def zb_v(
    stages: int,
    microbatches: int,
    *,
    memory_cap: float | None = None,
    w_subtasks: int = 1,
    costs: Costs | None = None,
) -> Schedule:
    """ZB-V: 2 chunks in the V shape, split W, greedy at 1F1B's memory (2p chunk units)."""
    p = _positive("stages", stages)
    cap = 2 * p if memory_cap is None else memory_cap
    return svpp(p, microbatches, 2, 1, memory_cap=cap, w_subtasks=w_subtasks,
                placement="v", costs=costs, name="zb-v")  # fmt: skip


def dualpipe(stages: int, microbatches: int, *, w_subtasks: int = 1) -> Schedule:
    """DualPipe: two model copies, micro-batches from both ends (``dualpipe_order``).

    Its rules are the reference's: an even number of ranks, and an even number of
    micro-batches, at least twice the ranks (m/2 per direction, >= p).
    """
    p, m = _positive("stages", stages), _positive("microbatches", microbatches)
    g = _positive("w_subtasks", w_subtasks)
    if p % 2:
        raise ScheduleError(f"stages: dualpipe needs an even number of ranks, got {p}")
    if m % 2 or m < 2 * p:
        raise ScheduleError(
            f"microbatches: dualpipe needs an even number, at least 2*stages = {2 * p} "
            f"(half enter from each end), got {m}"
        )
    t = Schedule("dualpipe", StagePlacement(p, 2, "dual"), m, backward="split", w_subtasks=g)
    return replace(t, ranks=with_communication(t, dualpipe_order(p, m, g)))


def _taking(has: Callable[[ScheduleKind], bool]) -> tuple[str, ...]:
    return tuple(name for name, kind in SCHEDULE_KINDS.items() if has(kind))


# Which schedules take each builder option, from their properties.
_TAKES = {
    "chunks": _taking(lambda kind: kind.chunks is None),
    "slices": _taking(lambda kind: kind.slices),
    "memory_cap": _taking(lambda kind: kind.memory_cap),
    "w_subtasks": _taking(lambda kind: kind.split_backward),
    "slicing": _taking(lambda kind: kind.slices),
    "costs": _taking(lambda kind: kind.cost_driven),
}


def build_schedule(name: str, *, stages: int, microbatches: int, **options: Any) -> Schedule:
    """Build schedule ``name`` (one of ``SCHEDULES``); options that it does not take, or
    that are ``None``, are an error or ignored respectively."""
    builders = {
        "gpipe": gpipe, "1f1b": one_f_one_b, "interleaved": interleaved, "zb-h1": zb_h1,
        "zb-2p": zb_2p, "zb-v": zb_v, "seq1f1b": seq1f1b, "svpp": svpp, "dualpipe": dualpipe,
    }  # fmt: skip
    if name not in builders:
        raise ScheduleError(f"schedule: must be one of {', '.join(SCHEDULES)}, got {name!r}")
    given = {key: value for key, value in options.items() if value is not None}
    for key in given:
        if key not in _TAKES:
            raise ScheduleError(f"{key}: unknown schedule option; allowed: {', '.join(_TAKES)}")
        if name not in _TAKES[key]:
            raise ScheduleError(f"{key}: {name} does not take it (only {', '.join(_TAKES[key])})")
    return builders[name](stages, microbatches, **given)
