"""What a policy decides: where each running job's workers sit, and how they are calibrated.

An ``Assignment`` maps every job that runs now to a ``Placement``; a job left out waits (or
is preempted, if it ran). A placement names one device per worker and, optionally, Gimbal's
two primitives: each worker's share of its device (resource restriction, MPS-style) and
each worker's local batch (input-sample stealing within the fixed global batch).
"""

from __future__ import annotations

from dataclasses import dataclass

from legato.cluster.jobs import ClusterJob, ClusterShape

MAX_TENANTS = 2  # workers on one device: Gimbal's limit, and the pairs Gavel measured


class AssignmentError(ValueError):
    """A policy produced an assignment the cluster cannot run (a bug in the policy)."""


@dataclass(frozen=True)
class Placement:
    devices: tuple[int, ...]  # one per worker
    shares: tuple[float | None, ...] | None = (
        None  # each worker's device share; None = unrestricted
    )
    split: tuple[int, ...] | None = None  # each worker's local batch; None = even

    def with_calibration(
        self, shares: tuple[float | None, ...] | None, split: tuple[int, ...] | None
    ) -> Placement:
        return Placement(self.devices, shares, split)


Assignment = dict[str, Placement]


def even_split(batch: int, workers: int) -> tuple[int, ...]:
    """``batch`` samples over ``workers`` as evenly as integers allow (the first get one more)."""
    base, extra = divmod(batch, workers)
    return tuple(base + (i < extra) for i in range(workers))


def tenants(assignment: Assignment) -> dict[int, list[tuple[str, int]]]:
    """Device -> the (job, worker index) pairs on it."""
    on: dict[int, list[tuple[str, int]]] = {}
    for name, placement in assignment.items():
        for worker, device in enumerate(placement.devices):
            on.setdefault(device, []).append((name, worker))
    return on


def check_assignment(
    assignment: Assignment,
    jobs: dict[str, ClusterJob],
    shape: ClusterShape,
    batches: dict[str, int],
) -> None:
    """Every placement well-formed and the devices not over-subscribed."""
    for name, placement in assignment.items():
        job = jobs[name]
        devices = placement.devices
        if len(devices) != job.workers or len(set(devices)) != len(devices):
            raise AssignmentError(f"{name}: needs {job.workers} distinct devices, got {devices}")
        if any(not 0 <= d < shape.devices for d in devices):
            raise AssignmentError(f"{name}: device out of range in {devices}")
        if placement.shares is not None and (
            len(placement.shares) != job.workers
            or any(s is not None and not 0 < s <= 1 for s in placement.shares)
        ):
            raise AssignmentError(f"{name}: shares must be one in (0, 1] (or None) per worker")
        if placement.split is not None and (
            len(placement.split) != job.workers
            or min(placement.split) < 1
            or sum(placement.split) != batches[name]
        ):
            raise AssignmentError(
                f"{name}: split {placement.split} must give each worker >= 1 of {batches[name]}"
            )
    for device, on in tenants(assignment).items():
        if len(on) > MAX_TENANTS:
            raise AssignmentError(f"device {device}: {len(on)} workers (at most {MAX_TENANTS})")
        if len(on) == 2 and on[0][0] == on[1][0]:
            raise AssignmentError(f"device {device}: two workers of job {on[0][0]}")
