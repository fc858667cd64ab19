"""The search space: factorisations of the device count and the options of each."""

from __future__ import annotations

import itertools

from legato.plan.space import (
    MOE_OVERLAPS,
    SearchSpace,
    execution_options,
    fast_domain,
    memory_ladder,
    overlap_variants,
    shapes,
    strategy_of,
)
from legato.specs import load_cluster, load_model
from legato.specs.model import ModelSpec, MoESpec

SPEC = ModelSpec(name="s", hidden_size=64, num_layers=12, num_heads=8, num_kv_heads=8,
                 vocab_size=256, seq_len=4096)  # fmt: skip


def test_fast_domain_is_the_node_or_the_supernode():
    assert fast_domain(load_cluster("dgx-h100", nodes=4)) == 8
    assert fast_domain(load_cluster("cloudmatrix384", nodes=96)) == 384
    assert fast_domain(load_cluster("cloudmatrix384", nodes=2)) == 16
    assert fast_domain(load_cluster("dgx-a100", nodes=1)) == 8


def test_factorisations_are_exactly_the_rule_abiding_ones():
    devices, space = 64, SearchSpace(max_cp=4, min_cp_tokens=1024)
    got = {(s.dp, s.tp, s.tp_y, s.pp, s.cp) for s in shapes(SPEC, devices, space, max_tp=8)}
    want = set()
    for dp, tp, pp, cp in itertools.product(range(1, 65), (1, 2, 4, 8), range(1, 13), (1, 2, 4)):
        if dp * tp * pp * cp != devices or SPEC.num_layers % pp:
            continue
        for tp_y in [1] + [y for y in (2, 4) if tp >= 4 and y <= tp // 2]:
            want.add((dp, tp, tp_y, pp, cp))
    assert got == want
    assert all(s.dp * s.tp * s.pp * s.cp == devices for s in shapes(SPEC, devices, space, 8))


def test_moe_shapes_add_expert_parallel_degrees_and_no_2d():
    moe = SPEC.with_(moe=MoESpec(num_experts=8, top_k=2, expert_ffn_hidden_size=32))
    found = list(shapes(moe, 16, SearchSpace(), max_tp=4))
    assert {s.tp_y for s in found} == {1}
    assert all(8 % s.ep == 0 and (s.tp * s.dp * s.cp) % s.ep == 0 for s in found)
    assert {s.ep for s in found if s.dp * s.cp == 16} == {1, 2, 4, 8}
    # tp=4 leaves dp*cp=4: ep=8 folds over the tensor-parallel ranks (Megatron-Core)
    assert {s.ep for s in found if (s.tp, s.dp, s.cp, s.pp) == (4, 4, 1, 1)} == {1, 2, 4, 8}
    # any common divisor of the experts and dp * cp, not only powers of two
    six = moe.with_(moe=MoESpec(num_experts=6, top_k=2, expert_ffn_hidden_size=32))
    assert {s.ep for s in shapes(six, 12, SearchSpace(), max_tp=1) if s.dp * s.cp == 12} == {
        1,
        2,
        3,
        6,
    }
    capped = SearchSpace(max_ep=2, max_pp=1)
    assert {(s.ep, s.pp) for s in shapes(moe, 16, capped, 1)} == {(1, 1), (2, 1)}


def test_schedule_options_respect_the_schedule_rules():
    space = SearchSpace()
    [shape] = [s for s in shapes(SPEC, 8, space, 1) if s.pp == 4 and s.cp == 1]
    options = list(execution_options(SPEC, shape, gbs=16, space=space))
    for o in options:
        m = 16 // (shape.dp * o["mbs"])
        assert m >= shape.pp
        if o["schedule"] == "interleaved":
            assert m % shape.pp == 0 and o["vpp"] >= 2 and (SPEC.num_layers // 4) % o["vpp"] == 0
        if o["schedule"] == "zb-v":
            assert o["vpp"] == 2
    names = {o["schedule"] for o in options}
    assert names == {"1f1b", "zb-h1", "zb-2p", "interleaved", "svpp"}  # 3 layers per stage: no zb-v
    assert shape.dp == 2 and {o["mbs"] for o in options} == {1, 2}  # m >= pp = 4


def test_dualpipe_is_searched_only_when_asked_for_and_where_it_runs():
    space = SearchSpace(schedules=("1f1b", "dualpipe"))
    [shape] = [s for s in shapes(SPEC, 8, space, 1) if s.pp == 4 and s.cp == 1]
    options = list(execution_options(SPEC, shape, gbs=32, space=space))
    dual = [16 // o["mbs"] for o in options if o["schedule"] == "dualpipe"]  # m per dp rank
    assert dual and all(m >= 2 * shape.pp and m % 2 == 0 for m in dual)
    assert all(
        o["schedule"] != "dualpipe" for o in execution_options(SPEC, shape, 32, SearchSpace())
    )


def test_an_unknown_schedule_to_search_is_a_one_line_error():
    import pytest

    from legato.specs.strategy import StrategyError

    with pytest.raises(StrategyError, match=r"schedules: each must be one of 1f1b, .*dualpipe"):
        SearchSpace(schedules=("1f1b", "pipedream"))


def test_memory_ladder_rows_and_columns():
    shape = next(iter(shapes(SPEC, 8, SearchSpace(), 1)))
    base = strategy_of(shape, {"mbs": 1, "schedule": "1f1b"}, 64, SearchSpace())
    grid = memory_ladder(SPEC, base, SearchSpace())
    if base.dp * base.cp > 1:
        assert [row[0].zero for row in grid] == [1, 2, 3]
    # 4096 tokens per micro-batch hold no two 4096-token loss chunks: no chunk columns
    columns = [(s.recompute, s.loss_chunk, s.swap) for s in grid[0]]
    assert columns == [("none", 0, False), ("selective", 0, False), ("full", 0, False),
                       ("full", 0, True)]  # fmt: skip
    longer = memory_ladder(SPEC, base.with_(mbs=2, gbs=128), SearchSpace())[0]
    columns = [(s.recompute, s.loss_chunk, s.swap) for s in longer]
    assert columns == [("none", 0, False), ("none", 4096, False), ("selective", 0, False),
                       ("full", 0, False), ("full", 4096, False), ("full", 4096, True)]  # fmt: skip
    lean = memory_ladder(SPEC, base, SearchSpace(loss_chunk=0, swap=False))[0]
    assert [s.recompute for s in lean] == ["none", "selective", "full"]


def test_moe_overlap_variants_only_with_expert_parallelism():
    moe = SPEC.with_(moe=MoESpec(num_experts=8, top_k=2, expert_ffn_hidden_size=32))
    [shape] = [s for s in shapes(moe, 8, SearchSpace(), 1) if s.dp == 8 and s.ep == 4]
    base = strategy_of(shape, {"mbs": 1, "schedule": "1f1b"}, 8, SearchSpace())
    variants = overlap_variants(moe, base, SearchSpace())
    assert variants[0].moe_overlap == "none" and len(variants) == len(MOE_OVERLAPS)
    assert {v.moe_overlap for v in variants} == {"none", "domino", "comet"}
    for v in variants:
        v.check(moe, 8)
    assert overlap_variants(moe, base.with_(ep=1), SearchSpace()) == [base.with_(ep=1)]
    assert overlap_variants(SPEC, base.with_(ep=1), SearchSpace()) == [base.with_(ep=1)]


def test_presets_give_a_sensible_space_size():
    model = load_model("llama3-405b")
    found = list(shapes(model, 16384, SearchSpace(), max_tp=8))
    assert {s.pp for s in found if not s.edges} == {1, 2}  # dividing 126 and 16384
    # with the embedding and the loss as layers of the split (Llama 3's own pp=16)
    assert {s.pp for s in found if s.edges} == {4, 8, 16, 32, 64, 128}
    assert max(s.tp for s in found) == 8
    assert len(found) < 250


def test_svpp_memory_caps_follow_no_and_full_recompute():
    """Smaller caps (midpoint, floor v*k) are tried only for svpp, after no recompute and
    after full recompute (with chunked loss where it applies), before swap; they save
    memory and the cost model charges them bubble once below the round trip D."""
    from legato.cost.training_step import predict
    from legato.plan.space import SearchSpace, memory_settings, smaller_caps
    from legato.specs import load_cluster, load_model
    from legato.specs.strategy import Strategy

    model, cluster = load_model("llama2-13b"), load_cluster("rtx4090-pcie", nodes=8)
    svpp = Strategy(dp=16, tp=1, pp=4, gbs=128, schedule="svpp", vpp=2, slices=2, zero=1)
    assert smaller_caps(svpp) == [8, 4]  # default (2+1)*4 + 2 - 2 = 12, floor 2*2
    assert smaller_caps(svpp.with_(schedule="1f1b", vpp=1, slices=1)) == []
    row = memory_settings(model, svpp, SearchSpace())
    capped = [(s["recompute"], s["memory_cap"]) for s in row if "memory_cap" in s]
    assert capped == [("none", 8), ("none", 4), ("full", 8), ("full", 4)]
    assert "swap" in row[-1] and "memory_cap" not in row[0]
    no_caps = memory_settings(model, svpp, SearchSpace(svpp_caps=False))
    assert all("memory_cap" not in s for s in no_caps)
    by_cap = [predict(model, cluster, svpp.with_(memory_cap=c)) for c in (0, 8, 4)]
    assert by_cap[0].memory_gib > by_cap[1].memory_gib > by_cap[2].memory_gib
    # D = (v p + k - 1) 2/3 = 6 slice units: 8 still keeps the pipeline busy, 4 does not
    assert by_cap[0].step_time_s == by_cap[1].step_time_s < by_cap[2].step_time_s
