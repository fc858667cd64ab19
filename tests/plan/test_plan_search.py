"""The search: valid, fitting, ranked plans; pruning that loses nothing; baseline; reports."""

from __future__ import annotations

import subprocess
import sys

import pytest

from legato.plan import PlanError, Scored, SearchSpace, baseline, make_plan, pareto_front, search
from legato.plan.baseline import baseline_tp
from legato.plan.space import execution_options, memory_ladder, shapes, strategy_of
from legato.specs import load_cluster, load_model
from legato.specs.strategy import Strategy, StrategyError

GIB = 2**30


@pytest.fixture(params=["fake", "predict"])
def scorer(request, fake_scorer):
    if request.param == "fake":
        return fake_scorer
    from legato.cost.training_step import predict

    return predict


def test_search_returns_valid_fitting_plans_sorted_by_throughput(scorer):
    model, cluster = load_model("llama3-8b"), load_cluster("dgx-h100", nodes=2)
    result = search(model, cluster, 64, top_k=8, scorer=scorer)
    assert 1 <= len(result.ranked) <= 8
    speeds = [s.prediction.tokens_per_s for s in result.ranked]
    assert speeds == sorted(speeds, reverse=True)
    for s in result.ranked:
        s.strategy.check(model, cluster.world_size)
        assert s.prediction.fits and s.strategy.gbs == 64
    fitting = [s for s in result.scored if s.prediction.fits]
    assert speeds[0] == max(s.prediction.tokens_per_s for s in fitting)
    assert result.stats.scored == len(result.scored) and result.stats.fits == len(fitting)


def test_pruning_loses_nothing_against_the_full_grid(fake_scorer):
    """Every memory cell of every option, scored without pruning: same best plan."""
    model, cluster = load_model("llama2-13b"), load_cluster("dgx-a100", nodes=2)
    space, gbs = SearchSpace(), 32
    best = None
    for shape in shapes(model, cluster.world_size, space, 8):
        for options in execution_options(model, shape, gbs, space):
            for row in memory_ladder(model, strategy_of(shape, options, gbs, space), space):
                for strategy in row:
                    try:
                        strategy.check(model, cluster.world_size)
                    except ValueError:
                        continue
                    p = fake_scorer(model, cluster, strategy)
                    if p.fits and (best is None or p.tokens_per_s > best):
                        best = p.tokens_per_s
    result = search(model, cluster, gbs, scorer=fake_scorer)
    assert result.best.prediction.tokens_per_s == pytest.approx(best)
    assert result.stats.skipped_dominated > 0


def test_pareto_front_is_monotone(fake_scorer):
    result = search(load_model("llama3-8b"), load_cluster("dgx-a100", nodes=1), 32,
                    scorer=fake_scorer)  # fmt: skip
    front = pareto_front(result.scored)
    memory = [s.prediction.memory_gib for s in front]
    speed = [s.prediction.tokens_per_s for s in front]
    assert memory == sorted(memory) and speed == sorted(speed) and len(front) >= 2
    for s in result.scored:  # nothing fitting beats a front point on both axes
        if s.prediction.fits:
            assert not any(
                s.prediction.memory_gib < f.prediction.memory_gib
                and s.prediction.tokens_per_s > f.prediction.tokens_per_s
                for f in front
            )


def test_baseline_heuristic_shape(scorer):
    model, cluster = load_model("llama3-70b"), load_cluster("dgx-h100", nodes=8)
    base = baseline(model, cluster, 256, scorer=scorer).plan
    s = base.strategy
    assert (s.tp, s.sp, s.mbs, s.schedule, s.zero) == (8, True, 1, "1f1b", 1)
    assert s.dp * s.pp * s.tp == 64 and base.prediction.fits
    smaller = [p for p in range(1, s.pp) if 80 % p == 0 and 8 % p == 0]
    for pp in smaller:  # PP is just enough: no smaller degree fits
        for recompute in ("none", "full"):
            fewer = s.with_(pp=pp, dp=64 // (8 * pp), recompute=recompute)
            assert not scorer(model, cluster, fewer).fits
    if s.recompute == "full":
        assert not scorer(model, cluster, s.with_(recompute="none")).fits


def test_baseline_tp_is_capped_by_the_heads():
    cluster = load_cluster("dgx-h100", nodes=1)
    assert baseline_tp(load_model("llama3-8b"), cluster) == 8
    assert baseline_tp(load_model("tiny"), cluster) == 2  # 2 KV heads


def test_report_explains_plans_and_the_gain(scorer):
    model, cluster = load_model("llama3-8b"), load_cluster("dgx-h100", nodes=4)
    report = make_plan(model, cluster, 128, top_k=3, scorer=scorer).to_dict()
    assert len(report["plans"]) == 3
    for plan in report["plans"]:
        assert {"strategy", "step_time_s", "tokens_per_s", "mfu", "memory_gib", "compute_s",
                "bubble_s", "exposed_comm_s", "memory_by_term_gib"} <= set(plan)  # fmt: skip
        assert plan["memory_by_term_gib"] and plan["compute_s"] > 0
    assert report["runner_up"].startswith("#2 (")
    assert report["gain_over_baseline"] >= 1.0  # the heuristic is one of the candidates' kin
    assert report["baseline"]["tokens_per_s"] * report["gain_over_baseline"] == pytest.approx(
        report["plans"][0]["tokens_per_s"]
    )


def test_runner_up_names_the_term_that_grew(fake_scorer):
    model, cluster = load_model("llama3-8b"), load_cluster("dgx-a100", nodes=1)
    best = search(model, cluster, 32, scorer=fake_scorer).best
    worse = best.strategy.with_(recompute="full")
    other = Scored(worse, fake_scorer(model, cluster, worse))
    report = make_plan(model, cluster, 32, scorer=fake_scorer)
    from legato.plan.explain import runner_up_gap

    assert "mostly compute" in runner_up_gap(best, other)
    assert report.runner_up


def test_model_that_fits_nowhere_names_the_memory_term(scorer):
    with pytest.raises(PlanError, match=r"does not fit on 8 devices.*largest term") as err:
        make_plan(load_model("llama3-405b"), load_cluster("dgx-a100", nodes=1), 8, scorer=scorer)
    assert "\n" not in str(err.value)


def test_impossible_batch_names_the_constraint(fake_scorer):
    # tiny: 4 layers, 2 KV heads, so 16 devices need dp >= 2, which cannot split 1 sequence
    with pytest.raises(PlanError, match="passes the constraints: gbs must be a multiple"):
        make_plan(load_model("tiny"), load_cluster("dgx-a100", nodes=2), 1, scorer=fake_scorer)
    with pytest.raises(PlanError, match="gbs must be >= 1"):
        make_plan(load_model("tiny"), load_cluster("dgx-a100", nodes=2), 0, scorer=fake_scorer)


def test_llama3_405b_on_2048_nodes_plans_within_a_bounded_search():
    """The planner's speed budget (10 s; ``benchmarks/plan_speed.py`` times it) rests on
    the search scoring a few thousand candidates, not on this machine's clock."""
    model, cluster = load_model("llama3-405b"), load_cluster("dgx-h100", nodes=2048)
    report = make_plan(model, cluster, 2048)
    assert report.result.best.prediction.fits
    assert 100 < report.result.stats.scored < 4000


def test_memoised_device_traffic_gives_the_same_predictions_in_any_order():
    """The data-parallel traffic is memoised across predictions; a prediction made after
    others (other schedules, batch sizes, ZeRO stages of the same shape) equals one
    made cold."""
    from legato.cost import predict
    from legato.cost import stage as cost_stage

    model, cluster = load_model("llama3-70b"), load_cluster("dgx-h100", nodes=8)
    texts = [
        "dp=8,tp=4,pp=2,zero=1,mbs=1,gbs=64",
        "dp=8,tp=4,pp=2,zero=1,mbs=1,gbs=64,schedule=interleaved,vpp=2",
        "dp=8,tp=4,pp=2,zero=1,mbs=1,gbs=64,schedule=svpp,vpp=2,slices=2",
        "dp=8,tp=4,pp=2,zero=3,mbs=1,gbs=64,schedule=zb-v,vpp=2",
        "dp=8,tp=4,pp=2,zero=1,mbs=2,gbs=64,schedule=dualpipe",
        "dp=8,tp=4,pp=2,zero=1,mbs=1,gbs=128",
    ]
    warm = [predict(model, cluster, Strategy.parse(t)).to_dict() for t in texts]
    for text, expected in zip(texts, warm, strict=True):
        cost_stage._DP_MEMO.clear()
        assert predict(model, cluster, Strategy.parse(text)).to_dict() == expected, text


def test_plan_package_does_not_import_torch():
    code = (
        "import sys, importlib, pkgutil, legato.plan\n"
        "for m in pkgutil.walk_packages(legato.plan.__path__, 'legato.plan.'):\n"
        "    importlib.import_module(m.name)\n"
        "from legato.plan.search import default_scorer; default_scorer()\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_gib_constant_matches_cost_model():
    from legato.cost.memory import GIB as COST_GIB

    assert GIB == COST_GIB


def test_strategies_the_scorer_rejects_count_as_invalid(fake_scorer):
    def no_context_parallel(model, cluster, strategy):
        if strategy.cp > 1:
            raise StrategyError("strategy: this cost model has no cp")
        return fake_scorer(model, cluster, strategy)

    result = search(load_model("llama3-8b"), load_cluster("dgx-a100", nodes=1), 32,
                    scorer=no_context_parallel)  # fmt: skip
    assert result.stats.invalid > 0 and "no cp" in result.stats.first_invalid
    assert result.best is not None and all(s.strategy.cp == 1 for s in result.scored)


def test_a_fitting_memory_cap_does_not_end_its_row():
    """A capped SVPP cell that fits is scored as an extra: the walk goes on to the
    recompute cells to its right, which may be faster than the cap's bubble."""
    from types import SimpleNamespace

    from legato.plan.search import Scored, SearchStats, _walk_ladder
    from legato.specs.strategy import Strategy

    base = Strategy(dp=1, tp=1, pp=4, gbs=8, schedule="svpp", vpp=2, slices=2)
    row = [base, base.with_(memory_cap=4), base.with_(recompute="full"), base.with_(swap=True)]
    fits = {row[1]: True, row[2]: True}
    seen = []

    def score(s):
        seen.append(s)
        return Scored(s, SimpleNamespace(fits=fits.get(s, False), tokens_per_s=1.0))

    assert _walk_ladder([row], score, SearchStats(), -1.0) is True
    assert seen == row[:3]  # the swap cell right of the fitting recompute is dominated
    assert _walk_ladder([row[:2]], score, SearchStats(), -1.0) is True  # only the cap fits
