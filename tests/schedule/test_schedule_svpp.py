"""SVPP under memory caps: never deadlocks from the v*k floor up, refuses lower caps."""

from __future__ import annotations

import pytest

from legato.schedule import (
    CostModel,
    ScheduleError,
    build_schedule,
    default_memory_cap,
    memory_floor,
    simulate,
    svpp,
    validate,
    zb_h1,
)
from legato.schedule.engine import ListScheduler

GRID = [(2, 3, 2, 2), (3, 4, 2, 3), (4, 8, 2, 2), (4, 5, 3, 1), (3, 6, 1, 4), (4, 4, 2, 4)]


@pytest.mark.parametrize(("p", "m", "v", "k"), GRID)
def test_every_cap_from_the_floor_up_completes_within_the_cap(p, m, v, k) -> None:
    floor, top = memory_floor(v, k), default_memory_cap(p, v, k)
    for cap in range(floor, top + 2):
        s = svpp(p, m, v, k, memory_cap=cap)
        r = simulate(s)
        assert max(r.peak_units) <= cap
        assert validate(s) == []
    assert max(simulate(svpp(p, m, v, k, memory_cap=top)).bubble_ratio) < max(
        simulate(svpp(p, m, v, k, memory_cap=floor)).bubble_ratio
    )


def test_weighted_equal_flop_slices_respect_the_cap() -> None:
    costs = CostModel(attention_share=0.5)
    for cap in (6, 7.5, 9):
        s = svpp(3, 4, 2, 3, memory_cap=cap, slicing="equal-flops", costs=costs)
        assert max(simulate(s, costs).peak_units) <= cap + 1e-9


@pytest.mark.parametrize("v, k, cap", [(2, 2, 3), (3, 2, 5.5), (1, 1, 0)])
def test_cap_below_the_dependency_floor_is_refused(v, k, cap) -> None:
    with pytest.raises(ScheduleError) as err:
        svpp(4, 8, v, k, memory_cap=cap)
    assert str(err.value) == (
        f"memory_cap: {cap:g} slice units is below the dependency floor "
        f"v*k = {v}*{k} = {v * k} for device 0"
    )


def test_greedy_without_reservation_deadlocks_below_about_1_5_vk() -> None:
    # the note: plain greedy list scheduling deadlocks below ~1.5 v k units
    p, m, v, k = 8, 16, 2, 4
    with pytest.raises(ScheduleError, match=r"schedule deadlocks: rank 0 holds 8 of 8 slice units"):
        svpp(p, m, v, k, memory_cap=v * k, reserve=False)
    svpp(p, m, v, k, memory_cap=1.5 * v * k, reserve=False)  # completes
    svpp(p, m, v, k, memory_cap=v * k)  # the reservation makes the floor itself safe


def test_planned_timeline_is_what_the_simulator_reproduces() -> None:
    costs = CostModel(f=1, b=1.3, w=0.7, latency=0.05, attention_share=0.3)
    s = svpp(4, 6, 2, 3, w_subtasks=2, costs=costs, slicing="equal-flops")
    plan = ListScheduler(s, costs, cap=default_memory_cap(4, 2, 3)).run()
    r = simulate(s, costs)
    for planned, timed in zip(plan, r.timeline, strict=True):
        assert [(a, pytest.approx(t0), pytest.approx(t1)) for a, t0, t1 in planned] == [
            (t.action, t.start, t.end) for t in timed
        ]


def test_fine_grained_w_fills_p2p_waits() -> None:
    costs = CostModel(latency=0.1)
    spans = [simulate(zb_h1(8, 16, w_subtasks=g, costs=costs), costs).makespan for g in (1, 4)]
    assert spans[1] < spans[0] * 0.93  # 63.4 -> 58.15 time units
    no_latency = [simulate(zb_h1(8, 16, w_subtasks=g)).makespan for g in (1, 4)]
    assert no_latency[0] == no_latency[1] == 55.0


@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        ("1f1b", {"slices": 2}, "slices: 1f1b does not take it (only seq1f1b, svpp)"),
        ("interleaved", {"chunks": 2}, "microbatches: interleaved needs a multiple of stages (4), got 6"),
        ("interleaved", {"chunks": 1}, "chunks: interleaved needs at least 2 per rank"),
        ("svpp", {"slices": 0}, "slices: must be a positive integer, got 0"),
        ("zb-v", {"memory_cap": 1}, "memory_cap: 1 slice units is below the dependency floor v*k = 2*1"),
        ("pipedream", {}, "schedule: must be one of gpipe, 1f1b"),
        ("svpp", {"w_subtasks": -1}, "w_subtasks: must be a positive integer, got -1"),
    ],
)  # fmt: skip
def test_bad_requests_are_one_line_errors_naming_the_field(name, options, message) -> None:
    with pytest.raises(ScheduleError) as err:
        build_schedule(name, stages=4, microbatches=6, **options)
    assert str(err.value).startswith(message)
    assert "\n" not in str(err.value)
