"""What every policy needs: which devices are free, and a consolidated pick of them.

Consolidation is every baseline's placement rule and one of Gimbal's: a job's workers on as
few nodes as possible (best fit — the fullest node that still holds it — so large holes stay
open for large jobs), spilling over the emptiest nodes first when no node holds it.
"""

from __future__ import annotations

from legato.cluster.jobs import ClusterJob, ClusterShape
from legato.cluster.placement import Assignment, Placement, tenants
from legato.cluster.simulator import ClusterView, JobProgress
from legato.cluster.speed import step_time


def free_devices(shape: ClusterShape, assignment: Assignment) -> set[int]:
    """Devices no worker of ``assignment`` is on."""
    return set(range(shape.devices)) - set(tenants(assignment))


def consolidated(shape: ClusterShape, free: set[int], count: int) -> tuple[int, ...] | None:
    """``count`` of the ``free`` devices on as few nodes as possible; None when too few."""
    if count > len(free):
        return None
    by_node: dict[int, list[int]] = {}
    for device in sorted(free):
        by_node.setdefault(shape.node_of(device), []).append(device)
    fitting = [n for n, devices in by_node.items() if len(devices) >= count]
    if fitting:
        node = min(fitting, key=lambda n: (len(by_node[n]), n))
        return tuple(by_node[node][:count])
    picked: list[int] = []
    for node in sorted(by_node, key=lambda n: (-len(by_node[n]), n)):
        picked.extend(by_node[node][: count - len(picked)])
        if len(picked) == count:
            break
    return tuple(picked)


def place_exclusive(
    view: ClusterView, assignment: Assignment, order: list[JobProgress], backfill: bool = True
) -> Assignment:
    """Give each job of ``order`` (not yet placed) free devices of its own, consolidated;
    a job that does not fit is skipped (``backfill``) or ends the pass (strict order)."""
    free = free_devices(view.shape, assignment)
    for state in order:
        if state.name in assignment:
            continue
        devices = consolidated(view.shape, free, state.job.workers)
        if devices is None:
            if backfill:
                continue
            break
        assignment[state.name] = Placement(devices)
        free -= set(devices)
    return assignment


def exclusive_rate(view: ClusterView, job: ClusterJob) -> float:
    """Steps/s of ``job`` alone on its own devices (the rate its duration is measured at)."""
    return 1.0 / step_time(job, None, [1.0] * job.workers, view.workloads)


def estimated_remaining_s(view: ClusterView, state: JobProgress) -> float:
    """Its remaining run time alone: the duration estimate duration-aware schedulers (Lucid,
    Gimbal) order by. Here it is exact, an oracle that flatters them equally."""
    return state.remaining / exclusive_rate(view, state.job)
