"""Lucid (Hu et al., ASPLOS'23): non-intrusive packing of low-interference pairs of equal size.

Jobs are ordered by estimated duration, shortest first (Lucid's estimator; here the true
remaining time, see ``estimated_remaining_s``), start on devices of their own when they fit
and are never preempted. Packing is indolent: only when a waiting job cannot get devices of
its own, and only beside a running job of the same worker count whose pair is predicted not
to interfere — each keeps at least ``MIN_SPEED`` of its solo speed (our stand-in for Lucid's
interference classifier, which packs only jobs whose combined device utilisation is low).
One guest per host; the pair is kept until one finishes.
"""

from __future__ import annotations

from legato.cluster.placement import Assignment, Placement, tenants
from legato.cluster.policies.common import estimated_remaining_s, place_exclusive
from legato.cluster.simulator import ClusterView

MIN_SPEED = 0.7


class Lucid:
    name = "lucid"
    round_s = None

    def assign(self, view: ClusterView) -> Assignment:
        order = sorted(view.waiting, key=lambda s: (estimated_remaining_s(view, s), s.name))
        assignment = place_exclusive(view, view.current(), order)
        on = tenants(assignment)
        for state in order:
            if state.name in assignment:
                continue
            partner = self._partner(view, assignment, on, state.job.workers, state.job.job_type)
            if partner is not None:
                devices = assignment[partner].devices
                assignment[state.name] = Placement(devices)
                for d in devices:
                    on[d].append((state.name, 0))
        return assignment

    @staticmethod
    def _partner(view, assignment, on, workers: int, job_type: str) -> str | None:
        """The running same-size, unpacked job this type interferes least with, if any
        pair keeps both above MIN_SPEED."""
        best, best_speed = None, 0.0
        for name, placement in sorted(assignment.items()):
            job = view.jobs[name]
            if job.workers != workers or any(len(on[d]) > 1 for d in placement.devices):
                continue
            speeds = view.workloads.pair_speeds(job_type, job.job_type)
            if speeds is not None and min(speeds) >= MIN_SPEED and sum(speeds) > best_speed:
                best, best_speed = name, sum(speeds)
        return best
