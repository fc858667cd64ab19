"""Simulator details (P2P time, measured durations, bytes) and the rendered outputs."""

from __future__ import annotations

import json

import pytest

from legato.schedule import (
    Action,
    CostModel,
    MeasuredCosts,
    ScheduleError,
    chrome_trace,
    one_f_one_b,
    render_pareto_png,
    render_timeline_png,
    seq1f1b,
    simulate,
    svpp,
    sweep,
    write_chrome_trace,
    write_pareto_json,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_p2p_latency_and_bandwidth_lie_on_the_critical_path() -> None:
    # p=2, m=1: F on rank 0, message, F + BW on rank 1, message, BW on rank 0
    costs = CostModel(latency=0.25, bandwidth=100.0, message_bytes=50.0)
    r = simulate(one_f_one_b(2, 1), costs)
    assert r.makespan == pytest.approx(6 + 2 * (0.25 + 0.5))
    # a slice's message carries its share of the tokens
    assert costs.message_time(1, seq1f1b(2, 1, 2)) == pytest.approx(0.25 + 0.25)


def test_measured_durations_override_the_model() -> None:
    s = one_f_one_b(2, 2)
    slow = Action("BW", 1, 0)
    r = simulate(s, MeasuredCosts({slow: 5.0}))
    assert r.busy == (1 + 2 + 1 + 5, 6.0)
    assert r.makespan == pytest.approx(max(t.end for t in r.timeline[0]))
    as_function = simulate(s, MeasuredCosts(lambda a: 2.0 if a.kind == "BW" else 1.0))
    assert as_function.makespan == simulate(s).makespan


def test_peak_memory_in_bytes_and_fraction() -> None:
    costs = CostModel(microbatch_activation_bytes=8e9)
    r = simulate(seq1f1b(4, 8, 4), costs)
    assert r.peak_units[0] == 7  # p + k - 1 slice units
    assert r.peak_bytes[0] == pytest.approx(7 / 4 * 8e9)
    assert r.peak_fraction[0] == pytest.approx(7 / 16)
    assert simulate(seq1f1b(4, 8, 4)).peak_bytes is None


def test_simulation_of_a_deadlocked_schedule_raises() -> None:
    s = one_f_one_b(2, 1)
    bad = type(s).from_dict({**s.to_dict(), "ranks": [
        ["F0@0", "RECV_B0@0", "SEND_F0@0", "BW0@0"], [str(a) for a in s.ranks[1]]
    ]})  # fmt: skip
    with pytest.raises(ScheduleError, match=r"rank 0 at RECV_B0@0 waits for SEND_B0@1 \(rank 1\)"):
        simulate(bad)


def test_chrome_trace_has_one_event_per_compute_action(tmp_path) -> None:
    s = svpp(3, 4, 2, 2, w_subtasks=2)
    r = simulate(s)
    path = tmp_path / "trace.json"
    write_chrome_trace(r, path)
    events = json.loads(path.read_text())["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    assert len(spans) == sum(a.is_compute for rank in s.ranks for a in rank) == 3 * 4 * 2 * 2 * 4
    assert {e["tid"] for e in spans} == {0, 1, 2}
    assert [e["args"]["name"] for e in events if e["name"] == "thread_name"] == [
        "rank 0", "rank 1", "rank 2"
    ]  # fmt: skip
    assert max(e["ts"] + e["dur"] for e in spans) == pytest.approx(r.makespan * 1e6)
    assert chrome_trace(r, time_unit_us=1.0)["traceEvents"][-1]["dur"] < 1.0


def test_timeline_and_pareto_pngs_are_written(tmp_path) -> None:
    render_timeline_png(simulate(svpp(3, 3, 2, 2)), tmp_path / "t.png")
    assert (tmp_path / "t.png").read_bytes()[:8] == PNG_MAGIC
    points = sweep(3, 3, chunks=(2,), slices=(1, 2))
    render_pareto_png(points, tmp_path / "p.png", "p=3 m=3")
    assert (tmp_path / "p.png").read_bytes()[:8] == PNG_MAGIC
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.png", "t.png"]  # no temp files


def test_pareto_front_is_exactly_the_non_dominated_points(tmp_path) -> None:
    points = sweep(4, 8, chunks=(1, 2), slices=(1, 2, 4))
    front = [p for p in points if p.on_front]
    for a in points:
        dominated = any(
            b.peak <= a.peak and b.bubble <= a.bubble and (b.peak < a.peak or b.bubble < a.bubble)
            for b in points
        )
        assert a.on_front is not dominated
    assert any(p.schedule == "svpp" for p in front)
    assert {"1f1b", "gpipe", "interleaved", "zb-h1", "zb-v", "seq1f1b"} <= {
        p.schedule for p in points
    }
    write_pareto_json(points, tmp_path / "p.json", stages=4, microbatches=8)
    data = json.loads((tmp_path / "p.json").read_text())
    assert data["stages"] == 4 and len(data["points"]) == len(points)
    assert data["front"] == [p.label for p in sorted(front, key=lambda q: q.peak)]
