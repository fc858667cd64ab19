"""The validator accepts every built schedule and catches each kind of broken one."""

from __future__ import annotations

from dataclasses import replace

import pytest

from legato.schedule import (
    Action,
    Schedule,
    ScheduleError,
    build_schedule,
    check,
    seq1f1b,
    simulate,
    validate,
)

BUILT = [
    ("gpipe", {}),
    ("1f1b", {}),
    ("interleaved", {"chunks": 3}),
    ("zb-h1", {"w_subtasks": 2}),
    ("zb-2p", {"w_subtasks": 2}),
    ("zb-v", {}),
    ("seq1f1b", {"slices": 3}),
    ("svpp", {"chunks": 2, "slices": 3, "memory_cap": 7}),
    ("svpp", {"chunks": 1, "slices": 2, "w_subtasks": 3}),
]


@pytest.mark.parametrize(("name", "options"), BUILT)
def test_every_builder_makes_a_valid_schedule(name, options) -> None:
    s = build_schedule(name, stages=3, microbatches=6, **options)
    assert validate(s) == []
    counts = {kind: sum(a.kind == kind for r in s.ranks for a in r) for kind in ("F", "W")}
    units = 6 * s.num_stages * s.slices
    assert counts["F"] == units
    assert counts["W"] == (0 if s.fused else units * s.w_subtasks)


def _edit(s: Schedule, rank: int, actions: list[Action]) -> Schedule:
    ranks = list(s.ranks)
    ranks[rank] = tuple(actions)
    return replace(s, ranks=tuple(ranks))


def test_slice_backwards_in_forward_order_are_caught() -> None:
    s = seq1f1b(2, 2, 2)
    r1 = list(s.ranks[1])
    i, j = r1.index(Action("BW", 0, 1, 0)), r1.index(Action("BW", 0, 1, 1))
    r1[i], r1[j] = r1[j], r1[i]
    problems = validate(_edit(s, 1, r1))
    assert "rank 1: BW0@1 comes before BW0.1@1, which it needs (slices go backward in " \
        "reverse order)" in problems  # fmt: skip


def test_missing_unit_is_caught() -> None:
    s = seq1f1b(2, 2, 2)
    problems = validate(_edit(s, 0, [a for a in s.ranks[0] if a != Action("F", 1, 0, 1)]))
    assert problems == ["F1.1@0 is missing"]


def test_duplicate_and_misplaced_actions_are_caught() -> None:
    s = seq1f1b(2, 2, 2)
    assert "BW1@0 appears 2 times" in validate(_edit(s, 0, [*s.ranks[0], Action("BW", 1, 0)]))
    assert validate(_edit(s, 0, [*s.ranks[0], Action("F", 0, 1)])) == [
        "rank 0: F0@1 belongs to rank 1"
    ]
    assert validate(_edit(s, 0, [*s.ranks[0], Action("F", 5, 0)]))[0].startswith(
        "rank 0: F5@0 is out of range (microbatch 5 >= microbatches 2)"
    )


def test_unmatched_send_is_caught() -> None:
    s = seq1f1b(2, 2, 2)
    problems = validate(_edit(s, 1, [a for a in s.ranks[1] if a != Action("RECV_F", 1, 1, 1)]))
    assert problems == ["SEND_F1.1@0 on rank 0 has no matching RECV_F1.1@1 on rank 1"]
    with pytest.raises(ScheduleError, match=r"schedule seq1f1b: SEND_F1\.1@0 on rank 0 has no"):
        check(_edit(s, 1, [a for a in s.ranks[1] if a != Action("RECV_F", 1, 1, 1)]))


def test_deadlock_reports_each_blocked_rank_and_what_it_waits_for() -> None:
    # each rank's own order is locally sound, but rank 1 wants micro-batch 1 first
    # while rank 0 only sends it after micro-batch 0's backward came back
    s = build_schedule("1f1b", stages=2, microbatches=2)
    rank0 = "F0@0 SEND_F0@0 RECV_B0@0 BW0@0 F1@0 SEND_F1@0 RECV_B1@0 BW1@0"
    rank1 = "RECV_F1@1 F1@1 RECV_F0@1 F0@1 BW0@1 SEND_B0@1 BW1@1 SEND_B1@1"
    bad = Schedule.from_dict({**s.to_dict(), "ranks": [r.split(" ") for r in (rank0, rank1)]})
    expected = (
        "deadlock: rank 0 at RECV_B0@0 waits for SEND_B0@1 (rank 1); "
        "rank 1 at RECV_F1@1 waits for SEND_F1@0 (rank 0)"
    )
    assert validate(bad) == [expected]
    with pytest.raises(ScheduleError, match="deadlock: rank 0 at RECV_B0@0"):
        simulate(bad)
