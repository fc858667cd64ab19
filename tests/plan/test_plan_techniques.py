"""The planner's device techniques: MoE overlap variants, chunked loss and swap when memory
is tight, FP8 only when asked, and explanations that name them."""

from __future__ import annotations

from dataclasses import replace

import pytest

from legato.cost.training_step import predict
from legato.plan import PlanError, SearchSpace, make_plan, search
from legato.plan.explain import techniques
from legato.specs import load_cluster, load_model
from legato.specs.model import ModelSpec, MoESpec

SMALL_MOE = ModelSpec(name="small-moe", hidden_size=512, num_layers=8, num_heads=8,
                      num_kv_heads=8, vocab_size=4096, seq_len=2048,
                      moe=MoESpec(num_experts=8, top_k=2, expert_ffn_hidden_size=256))  # fmt: skip
QWEN_64K = load_model("qwen3-235b-a22b").with_(seq_len=65536)
FSDP_ONLY = SearchSpace(max_tp=1, max_pp=1, max_cp=1, max_ep=1)


def _rewarding(fake_scorer, name: str, chunks: int, groups: int):
    """The fake cost model, with expert-parallel traffic that ``name`` hides 10% of."""

    def score(model, cluster, s):
        p = fake_scorer(model, cluster, s)
        if s.ep == 1:
            return p
        ep = 0.1 * p.step_time_s
        hidden = (s.moe_overlap, s.moe_chunks, s.moe_groups) == (name, chunks, groups)
        step = p.step_time_s - (ep if hidden else 0.0)
        exposed = {**p.breakdown["exposed_comm_s"], "ep": 0.0 if hidden else ep}
        breakdown = {**p.breakdown, "exposed_comm_s": exposed}
        return replace(p, step_time_s=step, tokens_per_s=p.tokens_per_s * p.step_time_s / step,
                       breakdown=breakdown)  # fmt: skip

    return score


def test_search_keeps_the_fastest_overlap_variant(fake_scorer):
    cluster = load_cluster("dgx-a100", nodes=1)
    result = search(SMALL_MOE, cluster, 16, scorer=_rewarding(fake_scorer, "comet", 4, 2))
    best = result.best.strategy
    assert best.ep > 1
    assert (best.moe_overlap, best.moe_chunks, best.moe_groups) == ("comet", 4, 2)
    # variants only where there is expert parallelism; ties keep plain
    assert all(s.strategy.moe_overlap == "none" for s in result.scored if s.strategy.ep == 1)
    tied = search(SMALL_MOE, cluster, 16, scorer=fake_scorer)
    assert all(s.strategy.moe_overlap == "none" for s in tied.ranked)


def test_planner_overlaps_a_communication_bound_expert_parallel_layer():
    """DeepSeek-V3 with EP 256 over InfiniBand: the plan overlaps its all-to-alls and is
    faster than the same plan without."""
    model, cluster = load_model("deepseek-v3"), load_cluster("h800", nodes=32)
    space = SearchSpace(max_tp=1, max_pp=1, max_cp=1, min_ep=64)
    best = search(model, cluster, 512, space=space).best
    assert best.strategy.moe_overlap != "none"
    plain = best.strategy.with_(moe_overlap="none", moe_chunks=1, moe_groups=1)
    assert predict(model, cluster, plain).step_time_s > best.prediction.step_time_s
    [line] = [t for t in techniques(best) if t.startswith("MoE")]
    assert best.strategy.moe_overlap in line and "per MoE layer over plain" in line


def test_swap_and_chunked_loss_only_when_nothing_cheaper_fits():
    """XTuner's case: a 200B-class MoE at 64K tokens, FSDP only on 256 H800s, fits only
    with full recompute, swap and the chunked loss together; the planner finds that."""
    cluster = load_cluster("h800", nodes=32)
    report = make_plan(QWEN_64K, cluster, 256, space=FSDP_ONLY)
    s = report.result.best.strategy
    assert (s.recompute, s.swap, s.loss_chunk, s.dtype) == ("full", True, 4096, "bf16")
    lines = report.to_dict()["plans"][0]["techniques"]
    assert any(line.startswith("activation swap: 46.0 GiB") for line in lines)
    assert any("chunked loss" in line for line in lines)
    with pytest.raises(PlanError, match="does not fit"):
        make_plan(QWEN_64K, cluster, 256, space=replace(FSDP_ONLY, swap=False, loss_chunk=0))
    # at 4K tokens the same model fits without either: neither is chosen
    short = search(QWEN_64K.with_(seq_len=4096), cluster, 256, space=FSDP_ONLY).best.strategy
    assert not short.swap and short.loss_chunk == 0


def test_fp8_only_when_asked():
    model, cluster = load_model("llama3-8b"), load_cluster("h800", nodes=1)
    default = make_plan(model, cluster, 64, top_k=3)
    assert all(s.strategy.dtype == "bf16" for s in default.result.scored)
    fp8 = make_plan(model, cluster, 64, top_k=3, space=SearchSpace(dtype="fp8"))
    assert all(s.strategy.dtype == "fp8" for s in fp8.result.ranked)
    assert fp8.baseline.plan.strategy.dtype == "fp8"  # the gain is not a precision change
    assert fp8.result.best.prediction.tokens_per_s > default.result.best.prediction.tokens_per_s
    with pytest.raises(PlanError, match="no fp8 peak"):
        make_plan(model, load_cluster("dgx-a100", nodes=1), 64, space=SearchSpace(dtype="fp8"))


def test_a_memory_cap_is_reported_with_its_bubble():
    from legato.plan.search import Scored
    from legato.specs.strategy import Strategy

    model, cluster = load_model("llama2-13b"), load_cluster("rtx4090-pcie", nodes=8)
    s = Strategy.parse("dp=16,pp=4,zero=2,gbs=128,schedule=svpp,slices=4,memory_cap=4")
    [line] = techniques(Scored(s, predict(model, cluster, s)))
    assert line.startswith("SVPP memory cap: 4 slice units in flight per device (default 7)")
    assert not techniques(Scored(s.with_(memory_cap=0), predict(model, cluster, s)))
