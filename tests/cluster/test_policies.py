"""FIFO, Lucid and Gimbal decide what their papers' rules give, on hand-made clusters."""

from __future__ import annotations

import pytest
from cluster_cases import A3C, R18, R50, job, view_of

from legato.cluster.placement import Placement, tenants
from legato.cluster.policies import make_policy
from legato.cluster.policies.gimbal import Gimbal
from legato.cluster.policies.lucid import MIN_SPEED
from legato.cluster.simulator import JobProgress
from legato.errors import ConfigError

LM = "LM (batch size 10)"
TRANSFORMER = "Transformer (batch size 32)"


def test_fifo_head_of_line_blocks(workloads):
    running = job(workloads, "r", R18, 1e4)
    big = job(workloads, "big", R18, 10.0, workers=2, arrival_s=1)
    small = job(workloads, "small", R18, 10.0, arrival_s=2)
    view = view_of(workloads, [running, big, small], 2, now=5, running={"r": Placement((0,))})
    assert make_policy("fifo").assign(view) == {"r": Placement((0,))}  # small may not jump


def test_lucid_packs_only_equal_low_interference_pairs_shortest_first(workloads):
    assert min(workloads.pair_speeds(R18, LM)) >= MIN_SPEED > min(workloads.pair_speeds(R50, A3C))
    jobs = [
        job(workloads, "r18", R18, 1e4),
        job(workloads, "r50", R50, 1e4),
        job(workloads, "long-lm", LM, 900.0),
        job(workloads, "lm", LM, 100.0),
        job(workloads, "a3c", A3C, 10.0),
        job(workloads, "two", R18, 10.0, workers=2),
    ]
    running = {"r18": Placement((0,)), "r50": Placement((1,))}
    out = make_policy("lucid").assign(view_of(workloads, jobs, 2, running=running))
    # the shortest (a3c) joins r18, where both keep MIN_SPEED; nothing else may join r50
    # (every pair with it falls below) and the two-GPU job packs only with two-GPU jobs
    assert out == {**running, "a3c": Placement((0,))}


def test_gimbal_packs_a_small_job_beside_a_larger_one(workloads):
    host = job(workloads, "host", TRANSFORMER, 1e4, workers=2)
    guest = job(workloads, "guest", LM, 500.0)
    running = {"host": Placement((0, 1))}
    view = view_of(workloads, [host, guest], 2, running=running)
    out = Gimbal().assign(view)
    assert out["guest"].devices in ((0,), (1,))
    assert make_policy("lucid").assign(view) == running  # Lucid packs equal sizes only
    assert Gimbal(unequal=False).assign(view) == running


def test_gimbal_steals_samples_from_the_packed_worker(workloads):
    host = job(workloads, "host", TRANSFORMER, 1e4, workers=2)
    guest = job(workloads, "guest", LM, 500.0)
    view = view_of(workloads, [host, guest], 2, running={"host": Placement((0, 1))})
    out = Gimbal(restriction=False).assign(view)
    packed = out["guest"].devices[0]
    split = out["host"].split
    assert sum(split) == host.local_batches(workloads)
    assert split[packed] < split[1 - packed]
    assert Gimbal(stealing=False, restriction=False).assign(view)["host"].split is None


def test_gimbal_sets_are_stars_of_at_most_two_per_device(workloads):
    host = job(workloads, "host", TRANSFORMER, 1e4, workers=2)
    guest = job(workloads, "guest", LM, 1e4)
    more = [job(workloads, f"w{i}", LM, 100.0 * (i + 1)) for i in range(3)]
    running = {"host": Placement((0, 1)), "guest": Placement((1,))}
    out = Gimbal().assign(view_of(workloads, [host, guest, *more], 2, running=running))
    assert max(len(on) for on in tenants(out).values()) == 2
    placed = [n for n in out if n.startswith("w")]
    assert len(placed) <= 1 and all(out[n].devices == (0,) for n in placed)  # beside the host


def test_gimbal_search_stops_after_three_trials_without_gain(workloads):
    host = job(workloads, "host", TRANSFORMER, 1e4, workers=2)
    guest = job(workloads, "guest", LM, 500.0)
    view = view_of(workloads, [host, guest], 2, running={"host": Placement((0, 1))})
    early, full = Gimbal(), Gimbal(patience=None)
    a, b = early.assign(view), full.assign(view)
    assert 4 <= early.trials < full.trials  # the start, >= 3 misses; the grid is 10 points
    score = lambda policy, out: policy._score(view, out)  # noqa: E731
    assert score(full, b) <= score(early, a) + 1e-9
    assert a["guest"].shares is not None or early.trials == 4


def test_gimbal_objective_is_checked():
    with pytest.raises(
        ConfigError, match="--objective: unknown objective 'fast'; choose one of jct"
    ):
        Gimbal(objective="fast")


def test_tiresias_ranks_by_attained_service_then_arrival(workloads):

    old = job(workloads, "old", R18, 1e5)
    first = job(workloads, "first", R18, 1e3, arrival_s=10)
    second = job(workloads, "second", R18, 1e3, arrival_s=20)
    view = view_of(workloads, [old, first, second], 1, now=600, running={"old": Placement((0,))})
    view.active[0].attained_gpu_s = 5000.0  # past the 1 GPU-hour queue boundary
    assert make_policy("tiresias").assign(view) == {"first": Placement((0,))}
    # a job that waited more than 4x its run time is promoted back to the first queue
    starved = JobProgress(job(workloads, "starved", R18, 1e5), attained_gpu_s=4000.0)
    view = view_of(workloads, [first], 1, now=100_000)
    view.active.insert(0, starved)
    view.jobs["starved"] = starved.job
    assert list(make_policy("tiresias").assign(view)) == ["starved"]
