"""Tiresias (Gu et al., NSDI'19): discretized two-dimensional least-attained-service.

A job's attained service is devices x time held (the two dimensions); jobs are ranked by
the queue their service falls in (thresholds ``QUEUES_GPU_S``), FIFO within a queue, and
re-ranked every round: a higher-ranked job takes devices from a lower-ranked one, which is
preempted (and pays the simulator's restart). No packing; consolidated placement; a job that
does not fit is skipped so smaller ones behind it run (Tiresias is work-conserving). A job
that has waited longer than ``STARVATION`` x its total run time is promoted to the first
queue, Tiresias' guard against starvation.
"""

from __future__ import annotations

import bisect

from legato.cluster.placement import Assignment, Placement
from legato.cluster.policies.common import consolidated
from legato.cluster.simulator import ClusterView, JobProgress

QUEUES_GPU_S = (3600.0, 36_000.0)  # queue boundaries in GPU-seconds: 1 and 10 GPU-hours
STARVATION = 4.0
ROUND_S = 300.0


class Tiresias:
    name = "tiresias"
    round_s = ROUND_S

    def assign(self, view: ClusterView) -> Assignment:
        order = sorted(view.active, key=lambda s: (self.queue(view, s), s.job.arrival_s, s.name))
        assignment: Assignment = {}
        free = set(range(view.shape.devices))
        held = {d for s in view.running for d in s.placement.devices}
        for state in order:
            if state.placement is not None and set(state.placement.devices) <= free:
                devices = state.placement.devices  # stays where it is: no needless migration
            else:  # idle devices first; a lower-ranked job's only when they do not suffice
                devices = consolidated(view.shape, free - held, state.job.workers)
                devices = devices or consolidated(view.shape, free, state.job.workers)
            if devices is not None:
                assignment[state.name] = Placement(devices)
                free -= set(devices)
        return assignment

    @staticmethod
    def queue(view: ClusterView, state: JobProgress) -> int:
        waited = view.now - state.job.arrival_s - state.attained_gpu_s / state.job.workers
        ran = state.attained_gpu_s / state.job.workers
        if state.placement is None and ran > 0 and waited > STARVATION * ran:
            return 0
        return bisect.bisect_right(QUEUES_GPU_S, state.attained_gpu_s)
