"""Gandiva's rules (Xiao et al., OSDI'18) on hand-made clusters: pack a waiting job with the
best same-size partner when full, refuse a pack that does not help, time-slice the
longest-held job out at a round."""

from __future__ import annotations

from cluster_cases import A3C, R18, R50

from legato.cluster.jobs import ClusterJob, ClusterShape
from legato.cluster.placement import Placement
from legato.cluster.policies import make_policy
from legato.cluster.policies.gandiva import Gandiva
from legato.cluster.simulator import ClusterView, JobProgress, simulate

LM = "LM (batch size 10)"


def job(name: str, job_type: str, workers: int = 1, steps: float = 1e4) -> ClusterJob:
    return ClusterJob(name=name, job_type=job_type, workers=workers, steps=steps)


def view_of(workloads, now, devices, running, waiting, round_s=300.0) -> ClusterView:
    """``running``: (job, devices, since_s); ``waiting``: jobs; one node of ``devices``; a
    round ends at every multiple of ``round_s``."""
    active = [
        JobProgress(j, placement=Placement(d), started_s=since, since_s=since, last_run_s=now)
        for j, d, since in running
    ] + [JobProgress(j) for j in waiting]
    jobs = {p.name: p.job for p in active}
    at_round = now > 0 and now % round_s == 0
    return ClusterView(now, ClusterShape(1, devices), workloads, active, jobs, at_round)


def gain(workloads, a: str, b: str) -> float:
    return sum(workloads.pair_speeds(a, b))


def test_pair_table_has_the_cases_the_tests_need(workloads):
    assert gain(workloads, A3C, R18) > gain(workloads, A3C, LM) > 1.0
    assert gain(workloads, A3C, R50) <= 1.0 and gain(workloads, R50, R50) <= 1.0


def test_free_devices_first_exclusive_and_consolidated(workloads):
    view = view_of(workloads, 0.0, 4, [(job("a", LM), (0,), 0.0)], [job("b", R18, workers=2)])
    assert Gandiva().assign(view) == {"a": Placement((0,)), "b": Placement((1, 2))}


def test_full_cluster_packs_onto_the_best_partner(workloads):
    running = [(job("lm", LM), (0,), 0.0), (job("r18", R18), (1,), 0.0)]
    view = view_of(workloads, 10.0, 2, running, [job("new", A3C)])
    out = Gandiva().assign(view)
    assert out == {"lm": Placement((0,)), "r18": Placement((1,)), "new": Placement((1,))}


def test_partner_must_have_the_same_worker_count(workloads):
    # the 2-worker ResNet-18 would pack better, but only the 1-worker LM has the same size
    running = [(job("r18", R18, workers=2), (0, 1), 0.0), (job("lm", LM), (2,), 0.0)]
    view = view_of(workloads, 10.0, 3, running, [job("new", A3C)])
    out = Gandiva().assign(view)
    assert out["new"] == Placement((2,))
    assert out["r18"] == Placement((0, 1)) and out["lm"] == Placement((2,))


def test_multi_worker_guest_takes_each_device_of_its_partner(workloads):
    running = [(job("r18", R18, workers=2), (0, 1), 0.0)]
    view = view_of(workloads, 10.0, 2, running, [job("new", A3C, workers=2)])
    assert Gandiva().assign(view)["new"] == Placement((0, 1))


def test_harmful_pack_is_refused(workloads):
    running = [(job("x", R50), (0,), 0.0), (job("y", R50), (1,), 0.0)]
    view = view_of(workloads, 10.0, 2, running, [job("new", A3C)])
    assert Gandiva().assign(view) == {"x": Placement((0,)), "y": Placement((1,))}


def test_a_partner_hosts_one_guest_only(workloads):
    running = [
        (job("host", R18), (0,), 0.0),
        (job("guest", A3C), (0,), 0.0),
        (job("r50", R50), (1,), 0.0),
    ]
    view = view_of(workloads, 10.0, 2, running, [job("new", A3C)])
    assert "new" not in Gandiva().assign(view)


def test_time_slicing_replaces_the_longest_held_job_at_a_round(workloads):
    running = [(job("old", R50), (0,), 0.0), (job("young", R50), (1,), 100.0)]
    waiting = [job("new", R50)]
    policy = Gandiva(round_s=300.0)
    between = view_of(workloads, 150.0, 2, running, waiting)
    assert policy.assign(between) == {"old": Placement((0,)), "young": Placement((1,))}
    at_round = view_of(workloads, 300.0, 2, running, waiting)
    assert policy.assign(at_round) == {"new": Placement((0,)), "young": Placement((1,))}


def test_time_slicing_only_swaps_jobs_of_the_same_size(workloads):
    running = [(job("big", R50, workers=2), (0, 1), 0.0), (job("small", R50), (2,), 200.0)]
    view = view_of(workloads, 300.0, 3, running, [job("new", R50)])
    assert Gandiva().assign(view) == {"big": Placement((0, 1)), "new": Placement((2,))}


def test_time_slicing_rotates_round_robin_in_simulation(workloads):
    rate = 1.0 / workloads.worker_time(R50, workloads.reference_batch(R50))
    jobs = [job(f"j{i}", R50, steps=2000 * rate) for i in range(3)]
    result = simulate(jobs, ClusterShape(1, 2), workloads, Gandiva(round_s=300.0))
    held = {}  # device -> who held it, in order
    for _start, _, device, names in sorted(result.timeline):
        if not held.get(device) or held[device][-1] != names:
            held.setdefault(device, []).append(names)
    # 300 s: j2 takes the device of j0 (held since 0, first by name); 600 s: j0, waiting
    # longest, takes j1's (held since 0, j2's only since 300); 900 s: j1 takes j2's
    assert held[0][:3] == [("j0",), ("j2",), ("j1",)]
    assert held[1][:2] == [("j1",), ("j0",)]
    assert all(p.restarts >= 1 for p in result.jobs)
    assert max(p.finished_s for p in result.jobs) < 3 * 2000 / 2 + 20 * 30.0


def test_registered_and_runs_a_trace(workloads):
    from legato.cluster.trace import default_trace, trace_jobs

    jobs = trace_jobs(default_trace(), workloads, 30, seed=1, load=4.0, max_gpus=4)
    result = simulate(jobs, ClusterShape.of_gpus(4), workloads, make_policy("gandiva"))
    assert all(p.finished_s is not None for p in result.jobs)
    assert any(len(names) == 2 for *_, names in result.timeline)  # it packed
