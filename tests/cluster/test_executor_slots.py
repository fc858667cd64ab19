"""A device's tenants keep distinct places (core-capped tenants take opposite ends of the
device): a running worker keeps its place, a newcomer takes the lowest free one."""

from __future__ import annotations

from types import SimpleNamespace

from legato.cluster.executor import Executor
from legato.cluster.job_types import JobType
from legato.cluster.jobs import ClusterJob, ClusterShape
from legato.cluster.placement import Placement
from legato.cluster.policies.fifo import Fifo


def test_running_tenants_keep_their_slots(workloads, tmp_path):
    key = "ResNet-18 (batch size 64)"  # a type the bundled table knows, under a legato name
    jobs = [ClusterJob("a", key, 1, 10), ClusterJob("b", key, 1, 10), ClusterJob("c", key, 1, 10)]
    executor = Executor(ClusterShape(1, 2), jobs, {"t": JobType("ResNet-18", 64, {})},
                        workloads, Fifo(), tmp_path)  # fmt: skip
    executor.running["a"] = SimpleNamespace(devices=(0,), slots=(1,))  # a holds slot 1 of 0
    slots = executor._slots({"b": Placement((0,)), "a": Placement((0,)), "c": Placement((1,))})
    assert slots[("a", 0)] == 1
    assert slots[("b", 0)] == 0  # listed first, but slot 1 is a's
    assert slots[("c", 0)] == 0
