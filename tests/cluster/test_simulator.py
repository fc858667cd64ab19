"""The event-driven simulator: finish times by hand, work conserved, restarts charged."""

from __future__ import annotations

import pytest
from cluster_cases import A3C, R18, R50, job

from legato.cluster.jobs import ClusterShape
from legato.cluster.placement import AssignmentError, Placement
from legato.cluster.policies import POLICIES, make_policy
from legato.cluster.report import metrics, render
from legato.cluster.simulator import simulate
from legato.cluster.trace import default_trace, trace_jobs
from legato.errors import ConfigError


class PackAll:
    """Every job on device 0 at once (a test policy)."""

    name, round_s = "pack-all", None

    def assign(self, view):
        return {s.name: Placement((0,)) for s in view.active}


def test_packed_pair_finishes_when_hand_computed(workloads):
    a, b = job(workloads, "a", A3C, 100.0), job(workloads, "b", R50, 400.0)
    fa, fb = workloads.pair_speeds(A3C, R50)
    result = simulate([a, b], ClusterShape(1, 1), workloads, PackAll())
    ends = {s.name: s.finished_s for s in result.jobs}
    first = 100.0 / fa  # a ends while packed; b then runs alone on what is left
    assert ends["a"] == pytest.approx(first)
    assert ends["b"] == pytest.approx(first + 400.0 - first * fb)
    assert all(s.done == s.job.steps for s in result.jobs)
    packed = sum(e - s for s, e, _, names in result.timeline if len(names) == 2)
    assert packed == pytest.approx(first)


def test_every_policy_conserves_work_on_a_trace(workloads):
    jobs = trace_jobs(default_trace(), workloads, 60, seed=2, load=8.0, max_gpus=8)
    total = sum(j.steps for j in jobs)
    for name in POLICIES:
        result = simulate(jobs, ClusterShape(1, 8), workloads, make_policy(name))
        assert sum(s.done for s in result.jobs) == pytest.approx(total, rel=1e-12), name
        for s in result.jobs:
            assert s.finished_s >= s.started_s >= s.job.arrival_s, name
        row = metrics(result)
        assert 0 < row["utilization"] <= 1 and row["jobs"] == 60


def test_preempted_job_pays_the_restart(workloads):
    """Tiresias preempts the long job for a new one; the long one loses restart_s."""
    long = job(workloads, "long", R18, 20_000.0)
    new = job(workloads, "new", R18, 100.0, arrival_s=10_000.0)
    result = simulate([long, new], ClusterShape(1, 1), workloads, make_policy("tiresias"), 30.0)
    ends = {s.name: s for s in result.jobs}
    assert ends["new"].finished_s == pytest.approx(10_100.0)
    assert ends["long"].restarts == 1
    assert ends["long"].finished_s == pytest.approx(20_100.0 + 30.0)


def test_a_bad_assignment_is_a_policy_bug(workloads):
    jobs = [job(workloads, n, R18, 10.0) for n in "abc"]
    with pytest.raises(AssignmentError, match="3 workers"):
        simulate(jobs, ClusterShape(1, 1), workloads, PackAll())


def test_unknown_policy_is_named():
    with pytest.raises(ConfigError, match="--policy: unknown policy 'srtf'; choose one of fifo"):
        make_policy("srtf")


def test_render_writes_a_png(tmp_path, workloads):
    jobs = trace_jobs(default_trace(), workloads, 20, seed=1, load=4.0, max_gpus=4)
    results = [
        simulate(jobs, ClusterShape(1, 4), workloads, make_policy(n)) for n in ("fifo", "gimbal")
    ]
    path = render(results, tmp_path / "c.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
