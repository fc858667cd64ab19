"""DualPipe in the cost model: two model copies, the schedule's closed form, the paired
chunks' overlap, and the copies' gradient sum."""

from __future__ import annotations

import pytest

from legato.cost import predict
from legato.specs import load_cluster, load_model
from legato.specs.strategy import Strategy, StrategyError

BASE = "dp=128,pp=16,ep=64,zero=1,mbs=1,gbs=8192"


@pytest.fixture(scope="module")
def deepseek():
    model, cluster = load_model("deepseek-v3").with_(seq_len=4096), load_cluster("h800", nodes=256)
    return {
        name: predict(model, cluster, Strategy.parse(f"{BASE},schedule={name}"))
        for name in ("dualpipe", "1f1b", "zb-h1")
    }


def test_the_terms_add_up_to_the_step(deepseek) -> None:
    p = deepseek["dualpipe"]
    b = p.breakdown
    terms = (b["compute_s"] + b["recompute_s"] + b["contention_s"] + b["bubble_s"]
             + b["optimizer_s"] + sum(b["exposed_comm_s"].values()))  # fmt: skip
    assert terms == pytest.approx(p.step_time_s, rel=1e-9)
    assert b["exposed_comm_s"]["copies"] > 0  # the two copies' gradients are summed


def test_two_copies_double_the_states_and_the_bubble_shrinks(deepseek) -> None:
    dual, one = deepseek["dualpipe"].breakdown, deepseek["1f1b"].breakdown
    for term in ("params", "grads", "optimizer"):
        assert dual["memory_gib"][term] == pytest.approx(2 * one["memory_gib"][term], rel=0.05)
    assert dual["bubble_s"] < deepseek["zb-h1"].breakdown["bubble_s"] < one["bubble_s"]
    assert dual["compute_s"] == pytest.approx(one["compute_s"], rel=0.1)


def test_paired_chunks_hide_expert_traffic(deepseek) -> None:
    """In the steady state a forward and a backward chunk of two micro-batches overlap,
    each hiding the other's all-to-alls: expert traffic is exposed less than under 1F1B,
    which hides none."""
    dual, one = deepseek["dualpipe"].breakdown, deepseek["1f1b"].breakdown
    assert dual["comm_s"]["ep"] == pytest.approx(one["comm_s"]["ep"], rel=0.1)
    assert one["exposed_comm_s"]["ep"] == pytest.approx(one["comm_s"]["ep"])
    assert dual["exposed_comm_s"]["ep"] < 0.8 * dual["comm_s"]["ep"]


@pytest.mark.parametrize(
    "text", ["dp=128,pp=15", "dp=128,pp=16,gbs=2048", "dp=128,pp=16,gbs=8320", "vpp=2"]
)
def test_sizes_dualpipe_cannot_run_are_one_line_errors(text: str) -> None:
    items = dict(x.split("=") for x in f"{BASE},{text},schedule=dualpipe".split(","))
    s = Strategy.parse(",".join(f"{k}={v}" for k, v in items.items()))
    with pytest.raises(StrategyError, match="dualpipe needs an even pp") as err:
        s.check(load_model("deepseek-v3"))
    assert "\n" not in str(err.value)
