"""Small hand-made cluster cases the policy and simulator tests share."""

from __future__ import annotations

from legato.cluster.jobs import ClusterJob, ClusterShape
from legato.cluster.simulator import ClusterView, JobProgress
from legato.cluster.workloads import Workloads

A3C = "A3C"
R18 = "ResNet-18 (batch size 16)"
R50 = "ResNet-50 (batch size 16)"


def job(
    workloads: Workloads,
    name: str,
    job_type: str,
    exclusive_s: float,
    workers: int = 1,
    arrival_s: float = 0.0,
) -> ClusterJob:
    """A job needing ``exclusive_s`` seconds alone on its own devices."""
    step = workloads.worker_time(job_type, workloads.reference_batch(job_type))
    step += workloads.sync_time(job_type, workers)
    return ClusterJob(
        name=name, job_type=job_type, workers=workers, steps=exclusive_s / step, arrival_s=arrival_s
    )


def view_of(
    workloads, jobs, devices, now=0.0, running=None, per_node=None, at_round=False
) -> ClusterView:
    """The view a policy gets: ``jobs`` arrived, ``running`` {name: Placement} placed."""
    running = running or {}
    active = [JobProgress(j, placement=running.get(j.name)) for j in jobs]
    shape = ClusterShape(devices // (per_node or devices), per_node or devices)
    return ClusterView(now, shape, workloads, active, {j.name: j for j in jobs}, at_round)
