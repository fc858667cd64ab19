"""The schedule IR: compact action text, placements, JSON round trips, slicing."""

from __future__ import annotations

import subprocess
import sys

import pytest

from legato.schedule import (
    Action,
    CostModel,
    Schedule,
    ScheduleError,
    StagePlacement,
    slice_bounds,
    svpp,
    token_bounds,
    zb_v,
)
from legato.schedule.slicing import slice_work


@pytest.mark.parametrize(
    ("token", "action"),
    [
        ("F3.1@4", Action("F", 3, 4, 1)),
        ("BW0@0", Action("BW", 0, 0)),
        ("W2.3@5#1", Action("W", 2, 5, 3, 1)),
        ("SEND_F3@0", Action("SEND_F", 3, 0)),
        ("RECV_B1.2@7", Action("RECV_B", 1, 7, 2)),
    ],
)
def test_action_text_round_trip(token: str, action: Action) -> None:
    assert Action.parse(token) == action
    assert str(action) == token


@pytest.mark.parametrize("token", ["X1@0", "F1", "F-1@0", "F1@0#x", ""])
def test_bad_action_text_is_one_line_error(token: str) -> None:
    with pytest.raises(ScheduleError, match="expected <kind><mb>"):
        Action.parse(token)


def test_action_rejects_subtask_outside_w_and_unknown_kinds() -> None:
    with pytest.raises(ScheduleError, match="only W actions have a subtask"):
        Action("F", 0, 0, 0, 1)
    with pytest.raises(ScheduleError, match="action kind"):
        Action("I", 0, 0)


def test_interleaved_and_v_placements() -> None:
    inter = StagePlacement(4, 2)
    assert [inter.stage(d, 1) for d in range(4)] == [4, 5, 6, 7]  # vs = c p + d
    v = StagePlacement(4, 2, "v")
    assert [v.stage(d, 0) for d in range(4)] == [0, 1, 2, 3]
    assert [v.stage(d, 1) for d in range(4)] == [7, 6, 5, 4]  # chunk 1 on p-1..0
    for place in (inter, v, StagePlacement(3, 3, "v")):
        for vs in range(place.num_stages):
            assert place.stage(place.rank(vs), place.chunk(vs)) == vs


def test_schedule_json_and_text_round_trip() -> None:
    for s in (svpp(3, 4, 2, 2, w_subtasks=2, memory_cap=6), zb_v(3, 3)):
        assert Schedule.from_json(s.to_json()) == s
        assert len(s.to_text().splitlines()) == s.stages


def test_schedule_from_dict_names_the_bad_field() -> None:
    data = svpp(2, 2, 1, 2).to_dict()
    with pytest.raises(ScheduleError, match=r"schedule\.colour: unknown field"):
        Schedule.from_dict({**data, "colour": 1})
    with pytest.raises(ScheduleError, match=r"schedule\.microbatches: required"):
        Schedule.from_dict({k: v for k, v in data.items() if k != "microbatches"})
    with pytest.raises(ScheduleError, match="slice_bounds: need 3 cut points"):
        Schedule.from_dict({**data, "slice_bounds": [0.0, 1.0]})
    with pytest.raises(ScheduleError, match="slice_bounds: must rise from 0 to 1"):
        Schedule.from_dict({**data, "slice_bounds": [0.0, 0.7, 0.6]})
    with pytest.raises(ScheduleError, match="slices: must be a positive integer, got 0"):
        Schedule.from_dict({**data, "slices": 0, "slice_bounds": [0.0]})
    with pytest.raises(ScheduleError, match="backward: must be 'fused' or 'split'"):
        Schedule.from_dict({**data, "backward": "both"})
    with pytest.raises(ScheduleError, match="action 7: expected"):
        Schedule.from_dict({**data, "ranks": [[7], []]})


def test_equal_flop_slices_have_equal_attention_work() -> None:
    bounds = slice_bounds(4, attention_share=0.5)
    works = [slice_work(bounds, j, 0.5) for j in range(4)]
    assert works == pytest.approx([0.25] * 4)
    assert bounds[1] - bounds[0] > bounds[4] - bounds[3]  # early slices are longer
    assert slice_bounds(4) == (0.0, 0.25, 0.5, 0.75, 1.0)
    # equal-length slices get dearer towards the end under causal attention
    cost = CostModel(attention_share=0.5)
    s = svpp(2, 1, 1, 4)
    f = [cost.duration(Action("F", 0, 0, j), s) for j in range(4)]
    assert f == sorted(f) and f[0] < f[3]


def test_token_bounds_round_and_reject_empty_slices() -> None:
    assert token_bounds(slice_bounds(4), 4096) == (0, 1024, 2048, 3072, 4096)
    with pytest.raises(ScheduleError, match="seq_len: 3 tokens"):
        token_bounds(slice_bounds(4), 3)


def test_schedule_layer_loads_without_torch_or_matplotlib() -> None:
    code = (
        "import sys, importlib, pkgutil, legato.schedule as s\n"
        "for m in pkgutil.walk_packages(s.__path__, s.__name__ + '.'):\n"
        "    importlib.import_module(m.name)\n"
        "print('torch' in sys.modules, 'matplotlib' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
