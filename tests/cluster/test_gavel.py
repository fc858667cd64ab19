"""Gavel's makespan LP with space sharing (Narayanan et al., OSDI'20) against hand-solved
optima, and its round-based mechanism in simulation."""

from __future__ import annotations

import pytest
from cluster_cases import A3C, R18, R50, job, view_of

from legato.cluster.jobs import ClusterShape
from legato.cluster.placement import Placement
from legato.cluster.policies import gavel as gavel_module
from legato.cluster.policies import make_policy
from legato.cluster.policies.gavel import Gavel
from legato.cluster.simulator import simulate
from legato.cluster.trace import default_trace, trace_jobs


def test_packable_pair_hand_solved_optimum(workloads):
    # max t: a + fa x >= tT, b + fb x >= tT, a + b + x <= 1 (one device, T = 1000 s each).
    # With fb >= fa the optimum packs x = tT/fb, runs A alone a = tT - fa x, B never alone,
    # and tT = fb / (1 + fb - fa) (the dual y1 = z, y2 = y1 (1 - fa) / fb certifies it).
    fa, fb = workloads.pair_speeds(A3C, R18)
    assert fb >= fa and fa + fb > 1
    jobs = [job(workloads, "a", A3C, 1000.0), job(workloads, "b", R18, 1000.0)]
    x, makespan = Gavel().allocation(view_of(workloads, jobs, 1))
    t_times_t = fb / (1 + fb - fa)
    assert makespan == pytest.approx(1000.0 / t_times_t, rel=1e-6)
    assert x[("a", "b")] == pytest.approx(t_times_t / fb, abs=1e-6)
    assert x[("a",)] == pytest.approx(t_times_t - fa * t_times_t / fb, abs=1e-6)
    assert x.get(("b",), 0.0) == pytest.approx(0.0, abs=1e-6)
    assert makespan < 2000.0  # packing beats time-sharing the device (1000 + 1000)


def test_harmful_pair_is_never_packed(workloads):
    assert sum(workloads.pair_speeds(A3C, R50)) <= 1.0
    jobs = [job(workloads, "a", A3C, 1000.0), job(workloads, "b", R50, 500.0)]
    view = view_of(workloads, jobs, 1)
    policy = Gavel()
    assert policy.candidate_pairs(view) == []
    x, makespan = policy.allocation(view)
    # time-sharing: X_a >= 1000 t, X_b >= 500 t, X_a + X_b <= 1 -> t = 1/1500
    assert makespan == pytest.approx(1500.0, rel=1e-6)
    assert x == pytest.approx({("a",): 2 / 3, ("b",): 1 / 3}, abs=1e-6)


def test_three_jobs_two_devices_hand_solved(workloads):
    # ResNet-50 with itself is harmful (sum < 1), so no pairs: the makespan is
    # max(longest, total / devices) = max(400, 900 / 2) = 450, every job's share T_j / 450
    assert sum(workloads.pair_speeds(R50, R50)) <= 1.0
    jobs = [job(workloads, f"j{i}", R50, s) for i, s in enumerate((200.0, 300.0, 400.0))]
    x, makespan = Gavel().allocation(view_of(workloads, jobs, 2))
    assert makespan == pytest.approx(450.0, rel=1e-6)
    assert x == pytest.approx(
        {("j0",): 200 / 450, ("j1",): 300 / 450, ("j2",): 400 / 450}, abs=1e-6
    )


def test_pairs_need_equal_worker_counts(workloads):
    jobs = [
        job(workloads, "a", A3C, 1000.0),
        job(workloads, "b", R18, 1000.0, workers=2),
        job(workloads, "c", R18, 1000.0),
    ]
    assert Gavel().candidate_pairs(view_of(workloads, jobs, 2)) == [("a", "c")]


def test_lp_skipped_when_everyone_fits(workloads, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the LP should be skipped")

    monkeypatch.setattr(gavel_module, "linprog", refuse)
    jobs = [job(workloads, "a", A3C, 1000.0), job(workloads, "b", R18, 300.0)]
    x, makespan = Gavel().allocation(view_of(workloads, jobs, 2))
    assert x == {("a",): 1.0, ("b",): 1.0} and makespan == pytest.approx(1000.0)


def test_a_running_job_keeps_its_devices_at_a_round(workloads):
    jobs = [job(workloads, "a", A3C, 1000.0), job(workloads, "b", R18, 300.0)]
    view = view_of(workloads, jobs, 2, now=360.0, running={"a": Placement((1,))}, at_round=True)
    assert Gavel().assign(view) == {"a": Placement((1,)), "b": Placement((0,))}


def test_mechanism_realises_the_packed_allocation(workloads):
    jobs = [job(workloads, "a", A3C, 1000.0), job(workloads, "b", R18, 1000.0)]
    result = simulate(jobs, ClusterShape(1, 1), workloads, Gavel())
    makespan = max(p.finished_s for p in result.jobs)
    fa, fb = workloads.pair_speeds(A3C, R18)
    optimum = 1000.0 * (1 + fb - fa) / fb
    assert any(names == ("a", "b") for *_, names in result.timeline)
    # within a round's quantisation and the restarts of the optimum, far below 2000 s alone
    assert optimum - 1e-6 <= makespan <= optimum + 360.0
    assert makespan < 2000.0


def test_makespan_no_worse_than_fifo_on_an_overloaded_trace(workloads):
    jobs = trace_jobs(default_trace(), workloads, 30, seed=1, load=4.0, max_gpus=4)
    shape = ClusterShape.of_gpus(4)
    ends = {}
    for name in ("fifo", "gavel"):
        result = simulate(jobs, shape, workloads, make_policy(name))
        ends[name] = max(p.finished_s for p in result.jobs)
    assert ends["gavel"] <= ends["fifo"]
