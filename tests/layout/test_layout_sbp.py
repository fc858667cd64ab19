"""Block layouts: the collectives each strategy's placements imply, against hand counts."""

from __future__ import annotations

import pytest

from legato.layout import (
    LayoutError,
    Shard,
    backward_collectives,
    forward_collectives,
    part_layout,
)
from legato.plan import weight_collectives
from legato.specs.model import ModelSpec, MoESpec
from legato.specs.strategy import Strategy, StrategyError

SPEC = ModelSpec(name="blk", hidden_size=64, num_layers=4, num_heads=4, num_kv_heads=4,
                 ffn_hidden_size=96, vocab_size=128, seq_len=32)  # fmt: skip
MOE = SPEC.with_(name="moe", moe=MoESpec(num_experts=8, top_k=2, expert_ffn_hidden_size=32,
                                         num_shared_experts=1))  # fmt: skip
MBS = 2


def tokens(dp: int = 1) -> int:
    return MBS * dp * SPEC.seq_len


def listed(collectives) -> list[tuple[str, str, str, float]]:
    return [(c.kind, c.axis, c.tensor, c.bytes) for c in collectives]


def layout(text: str, model: ModelSpec = SPEC, part: str = "dense"):
    dp = Strategy.parse(text).dp
    return part_layout(model, Strategy.parse(f"{text},mbs={MBS},gbs={MBS * dp}"), part)


def test_data_parallel_moves_nothing_per_layer():
    lay = layout("dp=4")
    assert forward_collectives(lay) == backward_collectives(lay) == []


def test_megatron_tp_all_reduces_each_sub_block_output():
    th = tokens() * 64 * 2  # bf16 hidden activation
    lay = layout("tp=4")
    assert listed(forward_collectives(lay)) == [
        ("all-reduce", "tp", "attn_out", 2 * th * 3 / 4),
        ("all-reduce", "tp", "mlp_out", 2 * th * 3 / 4),
    ]
    back = listed(backward_collectives(lay))
    assert back == [
        ("all-reduce", "tp", "x2n", 2 * th * 3 / 4),
        ("all-reduce", "tp", "xn", 2 * th * 3 / 4),
    ]
    # unfused projections (one nn.Linear each) reduce once per weight: q, k, v, gate, up
    assert len(backward_collectives(lay, fused=False)) == 5


def test_sequence_parallel_splits_each_all_reduce_into_gather_and_scatter():
    th = tokens() * 64 * 2
    lay = layout("tp=4,sp=1")
    assert listed(forward_collectives(lay)) == [
        ("all-gather", "tp", "xn", th * 3 / 4),
        ("reduce-scatter", "tp", "attn_out", th * 3 / 4),
        ("all-gather", "tp", "x2n", th * 3 / 4),
        ("reduce-scatter", "tp", "mlp_out", th * 3 / 4),
    ]
    assert [(c.kind, c.tensor) for c in backward_collectives(lay)] == [
        ("all-gather", "mlp_out"), ("reduce-scatter", "x2n"),
        ("all-gather", "attn_out"), ("reduce-scatter", "xn"),
    ]  # fmt: skip


def test_two_d_tensor_parallel_hand_counts():
    t = tokens()
    half = 1 / 2  # (p - 1) / p on each axis of 2
    h, q, kv, f = 64 * 2 * t, 4 * 16 * 2 * t, 4 * 16 * 2 * t, 96 * 2 * t  # bytes, logical
    rms = 4 * t  # fp32 statistics
    attention = [
        ("all-reduce", "tp_x", "attn_norm_rms", 2 * rms / 2 * half),  # hidden split on x
        ("all-gather", "tp_y", "xn", h / 2 * half),
        ("reduce-scatter", "tp_x", "q", q / 2 * half),
        ("all-reduce", "tp_x", "k", 2 * kv / 2 * half),
        ("all-reduce", "tp_x", "v", 2 * kv / 2 * half),
        ("all-gather", "tp_x", "o", q / 2 * half),
        ("reduce-scatter", "tp_y", "attn_out", h / 2 * half),
    ]
    mlp = [
        ("all-reduce", "tp_x", "mlp_norm_rms", 2 * rms / 2 * half),
        ("all-gather", "tp_y", "x2n", h / 2 * half),
        ("reduce-scatter", "tp_x", "g", f / 2 * half),
        ("reduce-scatter", "tp_x", "u", f / 2 * half),
        ("all-gather", "tp_x", "hh", f / 2 * half),
        ("reduce-scatter", "tp_y", "mlp_out", h / 2 * half),
    ]
    lay = layout("tp=2x2,sp=1")
    assert listed(forward_collectives(lay)) == attention + mlp
    dual = {
        "all-gather": "reduce-scatter",
        "reduce-scatter": "all-gather",
        "all-reduce": "all-reduce",
    }
    assert listed(backward_collectives(lay)) == [
        (dual[k], a, n, b) for k, a, n, b in reversed(attention + mlp)
    ]


def test_two_d_weights_follow_the_note():
    """The note's W1 = (S(0) on x, S(1) on y), W2 = (S(1) on x, S(0) on y) in math form
    (X W) are (S(1), S(0)) and (S(0), S(1)) in torch's [out, in] weights."""
    weights = {name: where for op in layout("tp=4x2").segments[0].ops for name, where in op.weights}
    assert weights["mlp.up_proj.weight"] == {"tp_x": Shard(1), "tp_y": Shard(0)}
    assert weights["mlp.gate_proj.weight"] == {"tp_x": Shard(1), "tp_y": Shard(0)}
    assert weights["mlp.down_proj.weight"] == {"tp_x": Shard(0), "tp_y": Shard(1)}
    assert weights["self_attn.q_proj.weight"] == {"tp_x": Shard(1), "tp_y": Shard(0)}


def test_context_parallel_gathers_keys_and_values():
    t = tokens()
    kv = 4 * 16 * 2 * t
    lay = layout("cp=2,tp=2,sp=1")
    fwd = listed(forward_collectives(lay))
    assert ("all-gather", "cp", "k", kv / 2 * (1 / 2)) in fwd  # k split on heads by tp
    assert [c[:3] for c in fwd].count(("all-gather", "tp", "xn")) == 1
    assert [(c.kind, c.axis, c.tensor) for c in backward_collectives(lay) if c.axis == "cp"] == [
        ("reduce-scatter", "cp", "v"), ("reduce-scatter", "cp", "k"),
    ]  # fmt: skip


def test_expert_parallel_all_to_all_and_shared_experts():
    t = tokens(dp=4)
    lay = layout("dp=4,ep=2,tp=2,sp=1", MOE, "moe")
    fwd = listed(forward_collectives(lay))
    routed = t * 2 * 64 * 2  # top-2 copies of each token's hidden state, bf16
    group = routed / (2 * 2)  # split by source over edp (2) and, sequence-wise, tp (2)
    assert ("all-to-all", "ep", "routed", group * 1 / 2 / 2) in fwd
    assert ("all-to-all", "ep", "ed", group * 1 / 2 / 2) in fwd
    kinds = [(k, a, n) for k, a, n, _ in fwd]
    assert ("all-gather", "tp", "x2n") in kinds  # shared experts are tensor parallel
    assert ("reduce-scatter", "tp", "sd") in kinds
    assert not any(a == "edp" for _, a, _ in kinds)


def test_expert_tensor_parallel_gathers_tokens_before_dispatch():
    lay = layout("dp=4,ep=4,tp=2,sp=1,etp=2", MOE, "moe")
    kinds = [(c.kind, c.axis, c.tensor) for c in forward_collectives(lay)]
    assert kinds.index(("all-gather", "tp", "x2n")) < kinds.index(("all-to-all", "ep", "routed"))
    assert ("reduce-scatter", "tp", "moe_out") in kinds


@pytest.mark.parametrize(
    "text, model, part",
    [("dp=2,tp=4", SPEC, "dense"), ("cp=2,tp=2,sp=1", SPEC, "dense"), ("tp=2x2", SPEC, "dense"),
     ("dp=4,ep=4,tp=2,sp=1", MOE, "moe"), ("dp=2,cp=2,ep=2,tp=2", MOE, "moe"),
     ("dp=4,ep=2,tp=2,sp=1,etp=2", MOE, "moe")],
)  # fmt: skip
def test_block_output_layout_is_its_input_layout(text, model, part):
    """Consecutive blocks need no extra redistribution."""
    lay = layout(text, model, part)
    first = next(w for op in lay.segments[0].ops for n, w in op.inputs if n == "x")
    last = next(w for op in lay.segments[-1].ops for n, w in op.outputs if n == "y")
    shared = set(first) & set(last)
    assert "tp" in shared or "tp_x" in shared or "tp" not in text
    assert {a: first[a] for a in shared} == {a: last[a] for a in shared}
    for segment in lay.segments:  # every op is placed on every axis of its segment
        for op in segment.ops:
            for _, where in op.inputs + op.weights + op.outputs:
                assert set(where) == set(segment.axis_sizes)


def test_embedding_and_head_are_vocab_parallel():
    t = tokens()
    emb = listed(forward_collectives(layout("tp=4,sp=1", part="embedding")))
    assert emb == [("reduce-scatter", "tp", "emb", t * 64 * 2 * 3 / 4)]
    head = listed(forward_collectives(layout("tp=4,sp=1", part="head")))
    stats = 2 * t * 4 * 3 / 4  # fp32 per token, all-reduced
    assert head == [("all-gather", "tp", "yn", t * 64 * 2 * 3 / 4)] + [
        ("all-reduce", "tp", name, stats) for name in ("loss_max", "loss_sumexp", "loss_target")
    ]


def test_layouts_that_are_not_covered_say_so():
    with pytest.raises(LayoutError, match="dense layers only"):
        layout("dp=2,ep=2,tp=2x2", MOE, "moe")
    with pytest.raises(LayoutError, match="etp = 1 or etp = tp"):
        layout("dp=2,ep=2,tp=4,etp=2", MOE, "moe")
    with pytest.raises(LayoutError, match="no MoE layers"):
        layout("tp=2", SPEC, "moe")
    with pytest.raises(
        StrategyError, match=r"head-splitting tp degree \(8\) must divide num_heads"
    ):
        layout("tp=8")
    assert forward_collectives(layout("tp=8x2"))  # 2-D splits heads by tp_y only


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_weight_and_gradient_collectives_by_zero_stage(zero):
    lay = layout(f"dp=4,tp=2,sp=1,zero={zero}")
    out = weight_collectives(lay)
    down = 64 * 96 * 2 / 2  # bf16, split by tp
    reduce = [c for c in out.per_microbatch + out.per_step if c.tensor == "mlp.down_proj.weight"]
    rs = ("reduce-scatter", "dp", down * 3 / 4)
    ag = ("all-gather", "dp", down * 3 / 4)
    expected = {0: [rs, ag], 1: [rs, ag], 2: [rs, ag], 3: [ag, ag, rs]}[zero]
    assert [c.key() for c in reduce] == expected
    per_mb = {c.tensor for c in out.per_microbatch}
    assert ("mlp.down_proj.weight" in per_mb) == (zero >= 2)
    norm = [
        c.axis for c in out.per_step + out.per_microbatch if c.tensor == "input_layernorm.weight"
    ]
    assert "tp" in norm  # sequence-parallel norm weights are reduced over tp too
    assert all(c.bytes > 0 for c in out.per_step + out.per_microbatch)
