"""How fast an assignment runs each job: the one speed model the simulator and the policies share.

A worker alone on its device runs at its solo speed (1). Two workers packed on a device run
at Gavel's measured pair speeds ``(f_a, f_b)``. Resource restriction re-divides what the
pair delivers: with shares ``s_a + s_b = 1`` each worker runs at ``min(1, (f_a + f_b) * s)``,
so the unrestricted split is the shares ``f / (f_a + f_b)`` and no share makes a worker
faster than alone. (This is our model of MPS active-thread limits: the device's combined
throughput is conserved and the limit moves it between the two.)

A data-parallel step waits for its slowest worker: ``max_i time(b_i) / speed_i`` plus the
gradient synchronisation, where ``b_i`` is worker i's local batch. Sample stealing picks the
``b_i`` that equalise the workers' times (the batch proportional to speed, net of each
worker's fixed per-step cost) within the fixed global batch.
"""

from __future__ import annotations

import math

from legato.cluster.jobs import ClusterJob
from legato.cluster.placement import Assignment, AssignmentError, Placement, even_split, tenants
from legato.cluster.workloads import Workloads


def worker_speeds(
    assignment: Assignment, jobs: dict[str, ClusterJob], workloads: Workloads
) -> dict[str, list[float]]:
    """Job -> each worker's speed over its solo speed, under this assignment."""
    speeds = {name: [1.0] * jobs[name].workers for name in assignment}
    for device, on in tenants(assignment).items():
        shares = [_share(assignment[name], worker) for name, worker in on]
        if len(on) == 1:
            (name, worker), share = on[0], shares[0]
            speeds[name][worker] = 1.0 if share is None else share
            continue
        (a, wa), (b, wb) = on
        natural = workloads.pair_speeds(jobs[a].job_type, jobs[b].job_type)
        if natural is None:
            raise AssignmentError(
                f"device {device}: {jobs[a].job_type!r} and {jobs[b].job_type!r} do not fit "
                "one device together"
            )
        speeds[a][wa], speeds[b][wb] = restricted(natural, shares[0], shares[1])
    return speeds


def restricted(
    natural: tuple[float, float], share_a: float | None, share_b: float | None
) -> tuple[float, float]:
    """The pair's speeds when shares are set (the other side takes what is left)."""
    if share_a is None and share_b is None:
        return natural
    if share_a is not None and share_b is not None and share_a + share_b > 1 + 1e-9:
        raise AssignmentError(f"shares {share_a} + {share_b} of one device exceed 1")
    total = natural[0] + natural[1]
    share_a = 1.0 - share_b if share_a is None else share_a
    share_b = 1.0 - share_a if share_b is None else share_b
    return min(1.0, total * share_a), min(1.0, total * share_b)


def _share(placement: Placement, worker: int) -> float | None:
    return None if placement.shares is None else placement.shares[worker]


def step_time(
    job: ClusterJob, split: tuple[int, ...] | None, speeds: list[float], workloads: Workloads
) -> float:
    """Seconds per optimizer step of ``job`` with these worker speeds and local batches
    (None = the even split)."""
    split = split or even_split(job.local_batches(workloads), job.workers)
    slowest = max(
        workloads.worker_time(job.job_type, b) / s for b, s in zip(split, speeds, strict=True)
    )
    return slowest + workloads.sync_time(job.job_type, job.workers)


def job_rates(
    assignment: Assignment, jobs: dict[str, ClusterJob], workloads: Workloads
) -> dict[str, float]:
    """Job -> optimizer steps per second under this assignment."""
    speeds = worker_speeds(assignment, jobs, workloads)
    return {
        name: 1.0 / step_time(jobs[name], placement.split, speeds[name], workloads)
        for name, placement in assignment.items()
    }


def stealing_split(job: ClusterJob, speeds: list[float], workloads: Workloads) -> tuple[int, ...]:
    """Local batches (each >= 1, summing to the global batch) that minimise the slowest
    worker's time: worker i's time ``(fixed + per_sample * b_i) / speed_i`` is made equal
    in the continuous solution, then rounded without making the slowest worse than needed."""
    batch = job.local_batches(workloads)
    fixed, per_sample = workloads.worker_line(job.job_type)
    active = list(range(job.workers))
    share = [1.0] * job.workers
    while True:  # workers whose equal-time batch would be < 1 keep 1 sample each
        free = batch - (job.workers - len(active))
        total_speed = sum(speeds[i] for i in active)
        level = (free * per_sample + len(active) * fixed) / total_speed
        wanted = {i: (level * speeds[i] - fixed) / per_sample for i in active}
        low = [i for i in active if wanted[i] < 1 - 1e-9]
        if not low or len(low) == len(active):
            break
        active = [i for i in active if i not in low]
    for i, value in wanted.items():
        share[i] = value
    split = [max(1, math.floor(v + 1e-9)) for v in share]  # floors: never more than the batch
    while sum(split) < batch:  # hand the rest out where it finishes soonest
        i = min(range(job.workers), key=lambda i: (fixed + per_sample * (split[i] + 1)) / speeds[i])
        split[i] += 1
    return tuple(split)
