"""Gandiva (Xiao et al., OSDI'18): exclusive placement, packing, and time-slicing.

Each piece implements one rule of the paper:

- Placement: a waiting job that fits the free devices gets devices of its own, consolidated
  (Gandiva's affinity-driven placement: a job's workers on as few nodes as possible).
  Waiting jobs are served oldest-waiting first (since they arrived, or since they were
  last suspended), so suspended jobs come back round-robin.
- Packing (Gandiva's "packing" introspective mechanism): when a waiting job does not fit,
  it is packed onto a running job with the *same* worker count, each of its workers on one
  of the partner's devices. The partner is the one with the best combined normalised
  throughput (the pair's speeds over their solo speeds from ``Workloads.pair_speeds``,
  summed, averaged over the workers), and the pack is made only if that sum is > 1:
  Gandiva keeps a pack only while it helps. A partner hosts one guest at most (at most 2
  workers per device).
- Time-slicing (Gandiva's suspend/resume): when jobs still wait, at each round
  (``round_s``) a waiting job replaces the same-size running job that has held its devices
  longest (``JobProgress.since_s``), taking over its devices; the simulator charges the
  suspended job its restart when it resumes. A replaced job that shares its devices leaves
  its slot only to a newcomer that the packing rule would pair with the partner.
- No needless migration: a running job keeps its devices until it finishes or is suspended.

Simplified: the paper *measures* a pack's benefit by introspection (run it, compare the
throughput, undo it) and may unpack later; here the measured pair table is known in
advance, so a pack is kept exactly when it would be kept after introspection and never
undone. Gandiva's migration to defragment and its grow-shrink are left out, and time
slicing is at job granularity (all of a job's workers suspended together), at the
simulator's rounds, not at Gandiva's per-GPU minibatch boundaries.
"""

from __future__ import annotations

from legato.cluster.jobs import ClusterJob
from legato.cluster.placement import Assignment, Placement, tenants
from legato.cluster.policies.common import place_exclusive
from legato.cluster.simulator import ClusterView, JobProgress

ROUND_S = 300.0


def pack_gain(view: ClusterView, a: ClusterJob, b: ClusterJob) -> float | None:
    """Combined normalised throughput of ``a`` packed with ``b`` (each worker of one on a
    device of the other): the pair's speeds over solo, summed and averaged over the workers;
    None when they cannot share (different worker counts, or the pair does not fit)."""
    if a.workers != b.workers:
        return None
    speeds = view.workloads.pair_speeds(a.job_type, b.job_type)
    if speeds is None:
        return None
    # every worker pair is the same two types, so the average over workers is one pair's sum
    return speeds[0] + speeds[1]


class Gandiva:
    name = "gandiva"

    def __init__(self, round_s: float = ROUND_S) -> None:
        self.round_s = round_s

    def assign(self, view: ClusterView) -> Assignment:
        assignment = view.current()
        waiting = sorted(view.waiting, key=_waiting_since)
        place_exclusive(view, assignment, waiting, backfill=True)
        left = [s for s in waiting if s.name not in assignment]
        for state in left:
            host = self.best_partner(view, assignment, state.job)
            if host is not None:
                assignment[state.name] = Placement(assignment[host].devices)
        left = [s for s in left if s.name not in assignment]
        if left and view.at_round:
            self._time_slice(view, assignment, left)
        return assignment

    def best_partner(
        self, view: ClusterView, assignment: Assignment, job: ClusterJob
    ) -> str | None:
        """The placed job ``job`` packs best with (alone on its devices, the same worker
        count, combined normalised throughput > 1); None when no pack helps."""
        on = tenants(assignment)
        best, best_gain = None, 1.0
        for name in sorted(assignment):
            if any(len(on[d]) > 1 for d in assignment[name].devices):
                continue  # already hosts a guest, or is one
            gain = pack_gain(view, job, view.jobs[name])
            if gain is not None and gain > best_gain:
                best, best_gain = name, gain
        return best

    def _time_slice(
        self, view: ClusterView, assignment: Assignment, left: list[JobProgress]
    ) -> None:
        """Each waiting job (oldest-waiting first) takes the devices of the same-size running
        job that has held its devices longest; a job resumed now is not suspended again."""
        held = sorted(
            (p for p in view.running if p.name in assignment), key=lambda p: (p.since_s, p.name)
        )
        for state in left:
            for victim in held:
                if victim.job.workers == state.job.workers and self._fits_slot(
                    view, assignment, victim.name, state.job
                ):
                    devices = assignment.pop(victim.name).devices
                    assignment[state.name] = Placement(devices)
                    held.remove(victim)
                    break

    @staticmethod
    def _fits_slot(view: ClusterView, assignment: Assignment, victim: str, job: ClusterJob) -> bool:
        """``job`` may take ``victim``'s devices: alone there, or packed with the job that
        shares them as the packing rule allows."""
        on = tenants(assignment)
        partners = {n for d in assignment[victim].devices for n, _ in on[d] if n != victim}
        for partner in partners:
            gain = pack_gain(view, job, view.jobs[partner])
            if gain is None or gain <= 1.0:
                return False
        return True


def _waiting_since(state: JobProgress) -> tuple[float, float, str]:
    return (max(state.last_run_s, state.job.arrival_s), state.job.arrival_s, state.name)
