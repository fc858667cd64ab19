"""The packing scheduler: token target from the profile, budget, load-aware task choice."""

from __future__ import annotations

import pytest

from legato.lora.scheduler import CostProfile, PackingScheduler, TaskDemand


def test_cost_profile_interpolates_and_extrapolates_linearly():
    profile = CostProfile((100, 200, 400), (1.0, 1.5, 2.5))
    assert profile.cost(150) == pytest.approx(1.25)
    assert profile.cost(800) == pytest.approx(4.5)
    assert profile.cost(50) == pytest.approx(0.75)
    assert CostProfile((100,), (2.0,)).cost(300) == pytest.approx(6.0)
    with pytest.raises(ValueError, match="must increase"):
        CostProfile((200, 100), (1.0, 2.0))


def test_target_is_the_largest_count_near_the_best_profiled_throughput():
    # throughput rises to 4096 tokens, then drops (e.g. caches overflow)
    profile = CostProfile((512, 1024, 2048, 4096, 8192), (1.0, 1.2, 1.6, 2.0, 8.0))
    assert PackingScheduler(100_000, profile).target_tokens == 4096
    assert PackingScheduler(3000, profile).target_tokens == 3000  # memory caps it
    assert PackingScheduler(3000).target_tokens == 3000  # no profile: fill memory


def _demands():
    return [
        TaskDemand("short", seq_len=64, sequences=4, remaining_tokens=64 * 8),
        TaskDemand("long", seq_len=256, sequences=4, remaining_tokens=256 * 40),
        TaskDemand("mid", seq_len=128, sequences=4, remaining_tokens=128 * 20),
    ]


def test_everything_is_fused_when_it_fits():
    plan = PackingScheduler(10_000).plan(_demands())
    assert dict(plan.take) == {"short": 4, "long": 4, "mid": 4}
    assert plan.tokens == 4 * (64 + 256 + 128)


def test_budget_is_respected_and_most_remaining_work_goes_first():
    plan = PackingScheduler(1200).plan(_demands())
    assert plan.tokens <= 1200
    assert plan.take[0] == ("long", 4)  # 1024 tokens, the largest remaining work
    assert dict(plan.take) == {"long": 4, "mid": 1}  # mid split: 1 of its 4 sequences fits


def test_a_task_longer_than_the_target_still_progresses_alone():
    profile = CostProfile((128, 256, 512), (1.0, 1.0, 10.0))  # best at 256 tokens
    sched = PackingScheduler(1000, profile)
    assert sched.target_tokens == 256
    plan = sched.plan([TaskDemand("big", 512, 2, 5000)])
    assert plan.take == (("big", 1),)


def test_nothing_to_do_gives_an_empty_plan():
    assert PackingScheduler(100).plan([TaskDemand("done", 16, 0, 0)]).take == ()
