"""The pipeline schedules legato knows, with the properties every level reads.

One table, in the lowest layer (no torch), because the strategy parser, the cost model,
the planner's search, the schedule builders, the trainer and the CLI all ask the same
questions of a schedule name: does it exist, how many model chunks does each rank hold,
does it slice the sequence, does it split the backward into B and W, does its order
depend on the per-op costs. The builders themselves live in ``legato.schedule``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ScheduleKind:
    """What a schedule is, independent of its size.

    ``chunks``: model chunks per rank — ``1`` (one stage per rank), ``2`` fixed (zb-v's V
    shape), or ``None`` when it is free and given as ``vpp``.
    """

    name: str
    chunks: int | None
    slices: bool = False  # runs on sequence slices (Seq1F1B, SVPP)
    split_backward: bool = False  # B (input gradient) and W (weight gradient) apart
    memory_cap: bool = False  # takes an in-flight memory cap
    cost_driven: bool = False  # its order is found from per-op costs (list scheduler)
    model_copies: int = 1  # DualPipe holds the model twice, one copy per direction

    def chunks_for(self, vpp: int) -> int:
        """Chunks per rank for a strategy's ``vpp``."""
        return vpp if self.chunks is None else self.chunks


SCHEDULE_KINDS: dict[str, ScheduleKind] = {
    kind.name: kind
    for kind in (
        ScheduleKind("gpipe", chunks=1),
        ScheduleKind("1f1b", chunks=1),
        ScheduleKind("interleaved", chunks=None),
        ScheduleKind("zb-h1", chunks=1, split_backward=True, cost_driven=True),
        ScheduleKind("zb-2p", chunks=1, split_backward=True, cost_driven=True),
        ScheduleKind("zb-v", chunks=2, split_backward=True, memory_cap=True, cost_driven=True),
        ScheduleKind("seq1f1b", chunks=1, slices=True, cost_driven=True),
        ScheduleKind(
            "svpp",
            chunks=None,
            slices=True,
            split_backward=True,
            memory_cap=True,
            cost_driven=True,
        ),
        ScheduleKind("dualpipe", chunks=2, split_backward=True, model_copies=2),
    )
}
SCHEDULES = tuple(SCHEDULE_KINDS)
# Schedules that cut a rank's share into more than one chunk (vpp > 1 or a fixed V);
# DualPipe's two chunks are two copies of one share (its strategy says vpp=1).
MULTI_CHUNK = tuple(
    name for name, kind in SCHEDULE_KINDS.items() if kind.chunks != 1 and kind.model_copies == 1
)
