"""The cost model's tensor-parallel traffic is the SBP layouts' (``legato.layout``).

``cost.layer.tp_collectives`` derives what ``predict`` times from each part's layout
(checked against DTensor in tests/parallel); these tests hold what it derives: the group
tensor's bytes give back the layout's bytes per device on every tensor-parallel axis,
``layer_work`` carries exactly them, and context parallelism keeps one stated
difference: the cost model's ring attention sends K/V in ``cp - 1`` steps forward (the
all-gather's bytes) and, backward, K/V again with their gradients: twice the layout's
reduce-scatter of dK/dV.
"""

from __future__ import annotations

from collections import Counter

import pytest

from legato.cost.calibration import CALIBRATION
from legato.cost.collectives import steps_and_wire_bytes
from legato.cost.compute import DeviceModel
from legato.cost.layer import Comm, edge_work, layer_work, tp_collectives
from legato.cost.runtime import Runtime
from legato.layout import backward_collectives, forward_collectives, part_layout
from legato.specs import load_device
from legato.specs.model import MLASpec, ModelSpec, MoESpec
from legato.specs.strategy import Strategy

LLAMA = ModelSpec(name="llama-gqa", hidden_size=256, num_layers=4, num_heads=16, num_kv_heads=4,
                  ffn_hidden_size=688, vocab_size=1024, seq_len=64)  # fmt: skip
GPT = ModelSpec(name="gpt-mha", hidden_size=192, num_layers=4, num_heads=8, mlp="gelu",
                norm="layernorm", position="learned", vocab_size=768, seq_len=64)  # fmt: skip
MIXTRAL = LLAMA.with_(
    name="moe-gqa", moe=MoESpec(num_experts=8, top_k=2, expert_ffn_hidden_size=512)
)
DEEPSEEK = LLAMA.with_(
    name="moe-mla-shared",
    num_kv_heads=16,
    mla=MLASpec(kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32),
    moe=MoESpec(num_experts=16, top_k=4, expert_ffn_hidden_size=96, num_shared_experts=1),
)
MBS = 2
TP_AXES = ("tp", "tp_x", "tp_y")
KIND = {"all-gather": "all_gather", "reduce-scatter": "reduce_scatter", "all-reduce": "all_reduce"}

DENSE_STRATEGIES = [
    "tp=4", "tp=4,sp=1", "tp=2x2,sp=1", "tp=4x2,sp=1", "tp=2x4,sp=1", "tp=2x2",
    "cp=2,tp=2,sp=1", "cp=4,tp=4", "cp=2,tp=2x2,sp=1", "dp=2,tp=4", "dp=4,tp=2x4,sp=1",
    "dp=2,cp=2,tp=4,sp=1", "tp=4,sp=1,dtype=fp32",
]  # fmt: skip
MOE_STRATEGIES = [
    "dp=4,ep=2,tp=2", "dp=4,ep=2,tp=4,sp=1", "dp=4,ep=4,tp=2,sp=1,etp=2", "dp=2,ep=2,tp=4,etp=4",
    "dp=2,cp=2,ep=4,tp=2,sp=1", "dp=2,cp=2,ep=2,tp=2,etp=2",
]  # fmt: skip
CASES = [
    (m, s, p)
    for m in (LLAMA, GPT)
    for s in DENSE_STRATEGIES
    for p in ("dense", "embedding", "head")
]
CASES += [(m, s, "moe") for m in (MIXTRAL, DEEPSEEK) for s in MOE_STRATEGIES]


def strategy(text: str) -> Strategy:
    dp = Strategy.parse(text).dp
    return Strategy.parse(f"{text},mbs={MBS},gbs={MBS * dp}")


def axis_size(s: Strategy, axis: str) -> int:
    return {"tp": s.tp, "tp_x": s.tp_x, "tp_y": s.tp_y, "cp": s.cp}[axis]


def planner(collectives, axes) -> Counter:
    """(kind, axis, bytes per device) of the layout's collectives on ``axes``."""
    return Counter(
        (KIND.get(c.kind, c.kind), c.axis, round(c.bytes, 6)) for c in collectives if c.axis in axes
    )


def cost(comms: tuple[Comm, ...], s: Strategy, axes) -> Counter:
    """The same for the cost model's collectives (``nbytes`` is the group's whole tensor)."""
    out: Counter = Counter()
    for c in comms:
        if c.axis in axes:
            wire = steps_and_wire_bytes(c.kind, c.nbytes, axis_size(s, c.axis))[1]
            out[(c.kind, c.axis, round(wire, 6))] += c.count
    return out


def bytes_per_axis(counts: Counter) -> dict[str, float]:
    out: dict[str, float] = {}
    for (_, axis, nbytes), n in counts.items():
        out[axis] = out.get(axis, 0.0) + n * nbytes
    return out


@pytest.mark.parametrize("model, text, part", CASES, ids=lambda v: getattr(v, "name", v))
def test_the_group_bytes_give_back_the_layouts_bytes_per_device(model, text, part):
    s = strategy(text)
    layout = part_layout(model, s, part)
    fwd, bwd = forward_collectives(layout), backward_collectives(layout)
    tp = tp_collectives(model, s, part)
    assert cost(tp.forward, s, TP_AXES) == planner(fwd, TP_AXES)
    assert cost(tp.backward, s, TP_AXES) == planner(bwd, TP_AXES)
    assert bytes_per_axis(planner(fwd, TP_AXES) + planner(bwd, TP_AXES))  # it moves something


def test_strategies_without_a_layout_are_one_line_errors():
    from legato.specs.strategy import StrategyError

    for text in ("dp=2,ep=2,tp=2x2,sp=1", "dp=2,ep=2,tp=4,sp=1,etp=2"):
        with pytest.raises(StrategyError, match="strategy: ") as err:
            tp_collectives(MIXTRAL, strategy(text), "moe")
        assert "\n" not in str(err.value)


DEVICE = DeviceModel.of(load_device("h100"), "bf16", CALIBRATION)


@pytest.mark.parametrize("model, text", [(LLAMA, "dp=2,cp=2,tp=2x2,sp=1"), (GPT, "cp=4,tp=4"),
                                         (DEEPSEEK, "dp=2,cp=2,ep=4,tp=2,sp=1,etp=2")])  # fmt: skip
def test_predict_times_these_collectives(model, text):
    """``layer_work`` and ``edge_work`` (what ``predict`` times) carry exactly them."""
    s, is_moe = strategy(text), model.moe is not None
    work = layer_work(model, is_moe, s, Runtime(), DEVICE)
    tp = tp_collectives(model, s, "moe" if is_moe else "dense")
    assert tuple(c for c in work.comms if c.axis in TP_AXES) == tp.forward
    assert tuple(c for c in work.bwd_comms if c.axis in TP_AXES) == tp.backward
    edges = edge_work(model, s, DEVICE, first=True, last=True)
    emb, head = tp_collectives(model, s, "embedding"), tp_collectives(model, s, "head")
    assert (edges.comms, edges.bwd_comms) == (
        emb.forward + head.forward,
        emb.backward + head.backward,
    )

    # context parallelism: the ring's forward bytes are the layout's K/V all-gathers; the
    # backward sends K/V and dK/dV (twice the layout's reduce-scatter of the gradients)
    layout = part_layout(model, s, "moe" if is_moe else "dense")
    cp_fwd = bytes_per_axis(planner(forward_collectives(layout), ("cp",)))
    cp_bwd = bytes_per_axis(planner(backward_collectives(layout), ("cp",)))
    ring = [c for c in work.comms if c.axis == "cp"]
    assert [c.kind for c in ring] == ["p2p"]
    assert ring[0].nbytes * ring[0].count == pytest.approx(cp_fwd["cp"])
    assert sum(c.nbytes * c.count for c in work.bwd_comms if c.axis == "cp") == pytest.approx(
        2 * cp_bwd["cp"]
    )


def test_two_d_tensor_parallel_moves_the_ffn_activation_on_tp_x():
    """The figure the old model missed: on tp_x a SwiGLU MLP moves 3 FFN-width tensors
    (gate and up reduce-scattered, the activation gathered) where tp_y moves 2 hidden-size
    ones, each split by the other axis."""
    s = strategy("tp=2x2,sp=1")
    counts = cost(tp_collectives(LLAMA, s, "dense").forward, s, TP_AXES)
    mlp = {k: n for k, n in counts.items() if k[1] == "tp_x" and k[0] != "all_reduce"}
    ffn = 3 * MBS * LLAMA.seq_len * LLAMA.ffn_hidden_size * 2 / 2 / 2  # bf16, / tp_y, (p-1)/p
    q_and_o = 2 * MBS * LLAMA.seq_len * LLAMA.hidden_size * 2 / 2 / 2
    assert sum(k[2] * n for k, n in mlp.items()) == pytest.approx(ffn + q_and_o)


def test_layout_gradients_the_cost_model_counts():
    """Two backward rules of the layout the cost model follows: token ids get no gradient,
    and with expert TP + SP the gathered tokens' and router logits' gradients (partial sums
    from the shared experts and the combine) are reduce-scattered once where they were
    gathered."""
    emb = part_layout(LLAMA, strategy("tp=4"), "embedding")
    assert [c.tensor for c in backward_collectives(emb)] == []
    moe = part_layout(DEEPSEEK, strategy("dp=4,ep=4,tp=2,sp=1,etp=2"), "moe")
    back = [(c.kind, c.tensor) for c in backward_collectives(moe) if c.axis == "tp"]
    assert ("reduce-scatter", "x2n") in back and ("reduce-scatter", "logits") in back
    assert back.count(("all-reduce", "routed")) == 1


def test_expert_parallelism_folded_over_tp_moves_on_tp_what_whole_experts_move():
    """ep folded over the tp ranks (etp = 1, sp): each rank routes its own token shard, so
    the tp axes carry the attention's and shared experts' traffic only, as with ep = 1."""
    folded = strategy("tp=2,sp=1,ep=2")
    assert folded.folded_ep
    assert tp_collectives(DEEPSEEK, folded, "moe") == tp_collectives(
        DEEPSEEK, strategy("tp=2,sp=1"), "moe"
    )
