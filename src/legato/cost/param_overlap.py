"""Data-parallel weight gathers and gradient reductions as they happen, unit by unit.

A framework gathers a sharded unit's weights (a block for FSDP, one submodule's
parameters for DeepSpeed) before computing it, on one communication stream, and issues
the gather of a later unit only when an earlier unit starts computing: ``prefetch_units``
ahead (FSDP's one), or as many upcoming units as keep fewer than ``prefetch_numel``
parameters in flight (DeepSpeed's prefetch bucket). A unit computes once its own gather
has ended and the unit before it is done; in the backward, its gradient reduction is
issued when its compute ends (or when it fills a bucket) and queues on the same link.
So a gather is hidden only behind the compute that runs between its issue and its need,
layer by layer: a unit whose compute is shorter than the next unit's gather exposes the
difference, and the last reduction of a pass is exposed in full. Gathers and reductions
share one queue: they cross the same NIC, so running them side by side would only split
its bandwidth.

``run_pass`` simulates one pass (a forward or a backward of one micro-batch) over a list
of ``Unit`` in execution order; the exposed time is the pass's length beyond its compute.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Unit:
    """One unit of a pass: its compute, the gather it waits for, the reduction issued when
    it ends, and the parameters it gathers (for prefetching by count)."""

    compute_s: float
    gather_s: float = 0.0
    reduce_s: float = 0.0
    numel: float = 0.0


@dataclass(frozen=True)
class PassTime:
    """One pass: its length from the first issue to the last compute or collective, and
    the compute and communication seconds inside it."""

    seconds: float
    compute_s: float
    comm_s: float

    @property
    def exposed_s(self) -> float:
        return max(0.0, self.seconds - self.compute_s)

    @property
    def hidden_s(self) -> float:
        return max(0.0, self.comm_s - self.exposed_s)


def issue_anchors(
    units: Sequence[Unit], prefetch_units: int = 1, prefetch_numel: float = 0.0
) -> list[int]:
    """For each unit, the unit whose compute start issues its gather (-1: the pass start).
    By count: ``k - prefetch_units``. By parameters (DeepSpeed's fetch_sub_module, which
    prefetches while the parameters in flight are below its bucket, not counting the unit
    it fetches): the earliest unit ``j`` such that the gathers between it and unit ``k``
    (units ``j+1 .. k-1``) hold fewer than ``prefetch_numel`` parameters; the next unit is
    always prefetched, and what unit 0's fetch prefetches is issued with it."""
    anchors = []
    for k in range(len(units)):
        if prefetch_numel <= 0:
            anchors.append(max(-1, k - prefetch_units))
            continue
        j, ahead = k - 1, 0.0
        while j > 0 and ahead + units[j].numel < prefetch_numel:
            ahead += units[j].numel
            j -= 1
        anchors.append(j)
    return anchors


def run_pass(units: Sequence[Unit], anchors: Sequence[int]) -> PassTime:
    """Simulate one pass (see the module docstring); ``anchors`` from ``issue_anchors``."""
    issued_by: dict[int, list[int]] = defaultdict(list)
    for k, anchor in enumerate(anchors):
        issued_by[anchor].append(k)
    link_free = 0.0
    gathered = [0.0] * len(units)

    def queue(at: float, seconds: float) -> float:
        nonlocal link_free
        if seconds > 0:
            link_free = max(link_free, at) + seconds
            return link_free
        return at

    for k in issued_by[-1]:
        gathered[k] = queue(0.0, units[k].gather_s)
    end = 0.0
    for k, unit in enumerate(units):
        start = max(end, gathered[k])
        for later in issued_by[k]:
            gathered[later] = queue(start, units[later].gather_s)
        end = start + unit.compute_s
        queue(end, unit.reduce_s)
    compute = sum(u.compute_s for u in units)
    comm = sum(u.gather_s + u.reduce_s for u in units)
    return PassTime(max(end, link_free), compute, comm)


def bucket_ends(numels: Sequence[float], bucket: float) -> list[float]:
    """Parameters reduced when each unit ends, in pass order: every unit's own with no
    bucket (``bucket <= 0``), else a bucket's worth each time the filled ones reach
    ``bucket`` and the rest at the last unit."""
    if bucket <= 0:
        return list(numels)
    out, filled = [], 0.0
    for n in numels:
        filled += n
        out.append(filled if filled >= bucket else 0.0)
        filled = 0.0 if filled >= bucket else filled
    if out:
        out[-1] += filled
    return out
