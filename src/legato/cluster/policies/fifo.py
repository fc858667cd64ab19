"""FIFO without packing: jobs start in arrival order on devices of their own and run to the
end; the head of the queue blocks the jobs behind it (no backfilling). The floor every
packing policy is measured from."""

from __future__ import annotations

from legato.cluster.placement import Assignment
from legato.cluster.policies.common import place_exclusive
from legato.cluster.simulator import ClusterView


class Fifo:
    name = "fifo"
    round_s = None

    def assign(self, view: ClusterView) -> Assignment:
        return place_exclusive(view, view.current(), view.waiting, backfill=False)
