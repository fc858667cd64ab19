"""SBP placements and the redistribution cost table of docs/planner.md (after Hypertron)."""

from __future__ import annotations

import pytest

from legato.layout import PARTIAL, REPLICATE, LayoutError, Shard, redistribute_cost
from legato.layout.placements import placement

T, P = 1024.0, 4  # tensor bytes, ranks on the axis


@pytest.mark.parametrize(
    "src, dst, kind, nbytes",
    [
        (REPLICATE, REPLICATE, None, 0),
        (Shard(1), Shard(1), None, 0),
        (REPLICATE, Shard(0), None, 0),  # local slice
        (Shard(0), Shard(1), "all-to-all", T * 3 / 16),
        (Shard(2), REPLICATE, "all-gather", T * 3 / 4),
        (PARTIAL, Shard(1), "reduce-scatter", T * 3 / 4),
        (PARTIAL, REPLICATE, "all-reduce", 2 * T * 3 / 4),
    ],
)
def test_table_rows(src, dst, kind, nbytes):
    moves = redistribute_cost(T, {"tp": src}, {"tp": dst}, {"tp": P})
    assert [(m.kind, m.axis, m.bytes) for m in moves] == (
        [] if kind is None else [(kind, "tp", nbytes)]
    )


@pytest.mark.parametrize("src", [REPLICATE, Shard(0)])
def test_moving_to_partial_is_refused(src):
    with pytest.raises(LayoutError, match="avoided"):
        redistribute_cost(T, {"tp": src}, {"tp": PARTIAL}, {"tp": P})


def test_other_axes_shrink_the_group_tensor_but_partial_does_not():
    sizes = {"dp": 2, "tp": 4}
    [move] = redistribute_cost(T, {"dp": Shard(0), "tp": PARTIAL}, {"dp": Shard(0)}, sizes)
    assert (move.kind, move.axis, move.bytes) == ("all-reduce", "tp", 2 * (T / 2) * 3 / 4)
    [move] = redistribute_cost(
        T, {"dp": PARTIAL, "tp": Shard(1)}, {"dp": Shard(0), "tp": Shard(1)}, sizes
    )
    assert (move.axis, move.bytes) == ("dp", (T / 4) * 1 / 2)


def test_gathers_run_last_and_slices_first():
    sizes = {"x": 2, "y": 2}
    moves = redistribute_cost(T, {"x": Shard(1), "y": Shard(0)}, {}, sizes)
    assert [(m.kind, m.axis, m.bytes) for m in moves] == [
        ("all-gather", "x", T / 2 / 2),  # y still sharded: half the tensor
        ("all-gather", "y", T / 2),
    ]
    moves = redistribute_cost(T, {"y": Shard(0)}, {"x": Shard(1)}, sizes)
    assert [(m.axis, m.bytes) for m in moves] == [("y", T / 2 / 2)]  # x sliced first
    moves = redistribute_cost(T, {"x": Shard(1), "y": PARTIAL}, {"y": Shard(0)}, sizes)
    assert [m.kind for m in moves] == ["reduce-scatter", "all-gather"]


def test_axes_of_size_one_are_silent():
    assert redistribute_cost(T, {"tp": PARTIAL}, {"tp": REPLICATE}, {"tp": 1}) == []


def test_placement_notation():
    assert [placement(t) for t in ("S(2)", "B", "P")] == [Shard(2), REPLICATE, PARTIAL]
    assert [str(p) for p in (Shard(0), REPLICATE, PARTIAL)] == ["S(0)", "B", "P"]
    with pytest.raises(LayoutError, match="S\\(<dim>\\), B or P"):
        placement("X")
