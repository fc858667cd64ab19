"""DualPipe in the schedule IR: two model copies, micro-batches entering from both ends."""

from __future__ import annotations

import pytest

from legato.schedule import build_schedule, simulate
from legato.schedule.costs import CostModel
from legato.schedule.dependencies import compute_actions
from legato.schedule.errors import ScheduleError
from legato.schedule.validate import validate


@pytest.mark.parametrize(("p", "m"), [(2, 4), (4, 8), (4, 10), (6, 12), (8, 16), (8, 22)])
def test_dualpipe_is_valid_and_deadlock_free(p: int, m: int) -> None:
    s = build_schedule("dualpipe", stages=p, microbatches=m)
    assert validate(s) == []
    # every micro-batch crosses p stages, one model copy: half of them each way
    stages = {mb: {a.stage for a in compute_actions(s) if a.microbatch == mb} for mb in range(m)}
    assert all(stages[mb] == set(range(p)) for mb in range(m // 2))
    assert all(stages[mb] == set(range(p, 2 * p)) for mb in range(m // 2, m))
    # down the ranks for the first copy, up for the second
    assert [s.placement.rank(vs) for vs in range(p, 2 * p)] == list(reversed(range(p)))


@pytest.mark.parametrize("p", [4, 6, 8])
def test_each_rank_holds_p_plus_1_micro_batches_and_does_1f1b_work(p: int) -> None:
    """DeepSeek-V3's Table 2: activations of PP + 1 micro-batches (1F1B's first rank
    holds PP); each rank does one stage's F, B and W per micro-batch, as in 1F1B."""
    m = 3 * p
    costs = CostModel(f=1.0, b=1.3, w=0.6)
    result = simulate(build_schedule("dualpipe", stages=p, microbatches=m), costs)
    assert result.peak_units == (p + 1,) * p
    assert result.busy == pytest.approx((m * (1.0 + 1.3 + 0.6),) * p)
    one_f_one_b = simulate(build_schedule("1f1b", stages=p, microbatches=m), costs)
    assert result.makespan < one_f_one_b.makespan


def test_deferred_weight_gradients_split_into_subtasks() -> None:
    s = build_schedule("dualpipe", stages=4, microbatches=8, w_subtasks=2)
    assert validate(s) == []
    assert sum(a.kind == "W" for rank in s.ranks for a in rank) == 2 * 8 * 4


@pytest.mark.parametrize(
    ("p", "m", "message"),
    [
        (3, 6, "stages: dualpipe needs an even number of ranks, got 3"),
        (4, 6, "microbatches: dualpipe needs an even number, at least 2*stages = 8"),
        (4, 9, "microbatches: dualpipe needs an even number, at least 2*stages = 8"),
    ],
)
def test_bad_sizes_are_one_line_errors(p: int, m: int, message: str) -> None:
    with pytest.raises(ScheduleError) as err:
        build_schedule("dualpipe", stages=p, microbatches=m)
    assert str(err.value).startswith(message)
    assert "\n" not in str(err.value)
