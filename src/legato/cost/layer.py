"""Work of one transformer block for one micro-batch on one device.

The block's GEMMs with their per-device shapes, its attention core, its memory-bound
elementwise traffic, and the bytes it sends on each mesh axis, for a dense or an MoE
block under tensor (1-D or 2-D), sequence, context and expert parallelism.

Sharding assumptions (Megatron-style): tensor parallelism splits heads and FFN columns;
sequence parallelism splits the norm/residual tokens; context parallelism splits the
sequence with load-balanced causal chunks; routed experts are balanced over all devices of
a stage (tokens spread evenly over experts) and MoE blocks assume sequence parallelism
when ``tp > 1`` (tokens are dispatched from their TP shard); their expert-parallel
all-to-alls are timed by ``cost.moe_layer_time.ep_exposure`` under the strategy's overlap
schedule, not here. MLA's low-rank projections are treated as one projection of the same
total weight, split by ``tp``. 2-D tensor parallelism splits the same FLOPs over ``tp``
devices (GEMM shapes as in 1-D); only its communication differs. Tensor-parallel
collectives are derived from the SBP layouts (``legato.layout``, :func:`tp_collectives`).
Block linears (projections, MLPs, experts) are timed by ``DeviceModel.linear_time`` (fp8
in FP8 training); attention, the router and the LM head in the training dtype.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache

from legato.cost.compute import DeviceModel, Gemm
from legato.cost.runtime import Runtime, activation_bytes, kernels_per_pass, op_bytes
from legato.layout import (
    Collective,
    LayoutError,
    backward_collectives,
    forward_collectives,
    part_layout,
)
from legato.layout.placements import collective_bytes
from legato.specs.model import ModelSpec
from legato.specs.params import attention_params
from legato.specs.strategy import Strategy, StrategyError


@dataclass(frozen=True)
class Comm:
    """One collective per layer and pass: ``kind`` on ``axis`` of a ``nbytes`` tensor,
    ``count`` times."""

    axis: str
    kind: str
    nbytes: float
    count: int = 1


@dataclass(frozen=True)
class PassComms:
    """Collectives of one part for one micro-batch: one forward and one backward pass."""

    forward: tuple[Comm, ...]
    backward: tuple[Comm, ...]


@dataclass(frozen=True)
class LayerWork:
    """Seconds and FLOPs of one block on one device for one micro-batch."""

    fwd_s: float  # GEMMs + attention + elementwise, forward
    bwd_input_s: float  # input-gradient GEMMs + attention backward + elementwise backward
    bwd_weight_s: float  # weight-gradient GEMMs (deferrable in zero-bubble schedules)
    attn_fwd_s: float  # attention core forward (selective recompute reruns it)
    attn_bwd_s: float
    comms: tuple[Comm, ...] = field(default=())  # forward (rerun by full recompute)
    bwd_comms: tuple[Comm, ...] = field(default=())  # backward
    gemm_fwd_s: float = 0.0  # the GEMMs of the forward (op-level recompute reruns some)
    memory_fwd_s: float = 0.0  # memory-bound elementwise ops of the forward
    # forward + backward seconds by op class ("gemm", "attention", "memory-bound",
    # "launch": per-kernel overhead and the host's issue-rate floor); they sum to the passes
    classes: tuple[tuple[str, float], ...] = field(default=())


def head_dims(model: ModelSpec) -> tuple[int, int]:
    """(query/key, value) width of one attention head."""
    if model.mla is None:
        return model.head_dim, model.head_dim
    return model.mla.qk_nope_head_dim + model.mla.qk_rope_head_dim, model.mla.v_head_dim


@lru_cache(maxsize=4096)  # pure; the planner asks again for every memory setting
def layer_work(
    model: ModelSpec,
    is_moe: bool,
    strategy: Strategy,
    runtime: Runtime,
    device: DeviceModel,
) -> LayerWork:
    """Work of one block (dense or MoE) for one micro-batch on one device."""
    s, b, t, c = model.seq_len, strategy.mbs, strategy.tp, strategy.cp
    h, d = model.hidden_size, activation_bytes(strategy.dtype)
    tokens = b * s / c  # tokens a device multiplies (after the sequence-parallel gather)
    sp_div = t if strategy.sp else 1
    mask = 1 if runtime.dropout else 0
    ops = op_bytes(runtime, d, model.mlp)
    qk_dim, v_dim = head_dims(model)
    weights = model.with_(bias=False, qkv_bias=False)
    proj = attention_params(weights)[0]
    out_w = model.num_heads * v_dim * h
    heads = model.num_heads / t

    linears = [Gemm(tokens, (proj - out_w) / (h * t), h), Gemm(tokens, h, out_w / (h * t))]
    others: list[Gemm] = []
    elementwise = 2 * (ops.norm + ops.residual) * tokens * h / sp_div
    qk_elements = tokens * (model.num_heads + model.num_kv_heads) * qk_dim / t
    if model.position == "rope":
        elementwise += ops.rope * qk_elements
    elementwise += ops.layout * (
        qk_elements + tokens * (model.num_kv_heads + model.num_heads) * v_dim / t
    )
    if runtime.flash_attention or c > 1:
        attn_fwd, attn_bwd = (
            _fused_attention(device, b, s, c, heads, _kv_heads(model) / t, (qk_dim + v_dim) / 2, bwd)
            for bwd in (False, True)
        )  # fmt: skip
    else:
        scores = [Gemm(s, s, qk_dim, b * heads), Gemm(s, v_dim, s, b * heads)]
        softmax_bytes = (2 * d + (2 * d + 1) * mask) * b * heads * s * s
        attn_fwd = sum(device.gemm_time(g) for g in scores) + device.memory_time(softmax_bytes)
        attn_bwd = sum(device.gemm_time(x) for g in scores for x in g.backward())
        attn_bwd += device.memory_time(2 * softmax_bytes)

    n_in = 2 if model.mlp == "swiglu" else 1
    tp = tp_collectives(model, strategy, "moe" if is_moe else "dense")
    fwd, bwd = list(tp.forward), list(tp.backward)
    if is_moe:
        moe = model.moe
        routed = tokens * moe.top_k / t  # expert-token pairs this device computes
        f_e = moe.expert_ffn_hidden_size
        per_expert = routed * strategy.ep * strategy.etp / moe.num_experts
        others.append(Gemm(tokens / t, moe.num_experts, h))  # router on the local tokens
        linears += [
            Gemm(per_expert, n_in * f_e / strategy.etp, h, moe.num_experts / strategy.ep),
            Gemm(per_expert, h, f_e / strategy.etp, moe.num_experts / strategy.ep),
        ]
        elementwise += ops.activation * routed * f_e + 4 * d * routed * h  # + permutes
        if moe.num_shared_experts:
            f_s = moe.num_shared_experts * moe.shared_expert_ffn_hidden_size
            linears += [Gemm(tokens, n_in * f_s / t, h), Gemm(tokens, h, f_s / t)]
            elementwise += ops.activation * tokens * f_s / t
    else:
        f = model.ffn_hidden_size
        linears += [Gemm(tokens, n_in * f / t, h), Gemm(tokens, h, f / t)]
        elementwise += ops.activation * tokens * f / t
    if c > 1:
        # a ring of K/V chunks, heads split as in the attention core; the backward
        # circulates K/V again together with their gradients
        kv_bytes = b * (s / c) * _kv_heads(model) / _head_split(strategy) * (qk_dim + v_dim) * d
        fwd.append(Comm("cp", "p2p", kv_bytes, c - 1))
        bwd.append(Comm("cp", "p2p", kv_bytes, 2 * (c - 1)))

    comms = PassComms(tuple(fwd), tuple(bwd))
    k = kernels_per_pass(runtime)
    kernels = (k.block_fwd, k.block_bwd)
    return _work(device, linears, others, elementwise, comms, attn_fwd, attn_bwd, kernels)


def _fused_attention(
    device: DeviceModel, b: float, s: float, c: int, heads: float, kv_heads: float,
    head_dim: float, backward: bool,
) -> float:  # fmt: skip
    """Fused causal attention of ``b`` sequences of ``s`` tokens, by the kernels' real
    shapes (``head_dim``: the mean of the query/key and value widths, which keeps the
    FLOPs). Under context parallelism ``c`` ring steps each run a kernel over the local
    ``s / c`` queries: the first against its own keys (causal), the ``c - 1`` others, with
    load-balanced (zigzag) chunks, against half as many keys, unmasked."""
    q = s / c

    def kernel(kv: float, causal: bool) -> float:
        return device.attention_time(b, q, kv, heads, kv_heads, head_dim, causal=causal,
                                     backward=backward)  # fmt: skip

    return kernel(q, True) + (c - 1) * kernel(q / 2, False)


@lru_cache(maxsize=4096)  # pure; each prediction asks for its edges several times
def edge_work(
    model: ModelSpec,
    strategy: Strategy,
    device: DeviceModel,
    first: bool,
    last: bool,
    runtime: Runtime | None = None,
) -> LayerWork:
    """The embedding (first stage) and the LM head with its loss (last stage): the head
    GEMM over the vocabulary shard, the loss's logits written, read for softmax and written
    as gradients (4 passes at ``runtime.loss_bytes`` plus the low-precision logits), the
    embedding gather. ``runtime`` also sets the edge kernels' count (``kernels_per_pass``)."""
    runtime = runtime or Runtime()
    s, t = model.seq_len, strategy.tp
    tokens = strategy.mbs * s / strategy.cp
    h, d = model.hidden_size, activation_bytes(strategy.dtype)
    gemms, elementwise, fwd, bwd = [], 0.0, (), ()
    if first:
        elementwise += 2 * d * tokens * h / (t if strategy.sp else 1)
        emb = tp_collectives(model, strategy, "embedding")
        fwd, bwd = emb.forward, emb.backward
    if last:
        gemms.append(Gemm(tokens, model.vocab_size / t, h))  # stays in bf16 under fp8
        elementwise += (d + 4 * runtime.loss_bytes) * tokens * model.vocab_size / t
        head = tp_collectives(model, strategy, "head")
        fwd, bwd = fwd + head.forward, bwd + head.backward
    k = kernels_per_pass(runtime)
    kernels = (k.edge_fwd, k.edge_bwd) if first or last else (0, 0)
    return _work(device, [], gemms, elementwise, PassComms(fwd, bwd), 0.0, 0.0, kernels)


def _work(
    device: DeviceModel,
    linears: list[Gemm],
    others: list[Gemm],
    elementwise: float,
    comms: PassComms,
    attn_fwd: float,
    attn_bwd: float,
    kernels: tuple[int, int],
) -> LayerWork:
    """Times of block-linear and other GEMMs plus attention plus elementwise bytes plus
    the per-kernel overhead of ``kernels`` (forward, backward), each pass no shorter than
    the host takes to issue its kernels; the backward runs two GEMMs per forward GEMM and
    moves twice the elementwise bytes (read the saved input and the incoming gradient,
    write the outgoing one)."""
    timed = [(g, device.linear_time) for g in linears] + [(g, device.gemm_time) for g in others]
    fwd = sum(time(g) for g, time in timed)
    bwd = [(g.backward(), time) for g, time in timed]
    ew = device.memory_time(elementwise)
    n_fwd, n_bwd = kernels
    bwd_weight = sum(time(dw) for (_, dw), time in bwd)
    bwd_gemm_input = sum(time(dx) for (dx, _), time in bwd)
    bwd_input = bwd_gemm_input + attn_bwd + 2 * ew
    fwd_s = max(fwd + attn_fwd + ew + device.kernels_time(n_fwd), device.launch_floor(n_fwd))
    bwd_input_s = max(
        bwd_input + device.kernels_time(n_bwd), device.launch_floor(n_bwd) - bwd_weight
    )
    gemm = fwd + bwd_gemm_input + bwd_weight
    attention = attn_fwd + attn_bwd
    launch = fwd_s + bwd_input_s + bwd_weight - gemm - attention - 3 * ew
    return LayerWork(
        fwd_s=fwd_s,
        bwd_input_s=bwd_input_s,
        bwd_weight_s=bwd_weight,
        attn_fwd_s=attn_fwd,
        attn_bwd_s=attn_bwd,
        comms=comms.forward,
        bwd_comms=comms.backward,
        gemm_fwd_s=fwd,
        memory_fwd_s=ew,
        classes=(
            ("gemm", gemm),
            ("attention", attention),
            ("memory-bound", 3 * ew),
            ("launch", launch),
        ),
    )


TP_AXES = ("tp", "tp_x", "tp_y")  # the mesh axes of tensor parallelism (1-D, 2-D)
_KINDS = {"all-gather": "all_gather", "reduce-scatter": "reduce_scatter",
          "all-reduce": "all_reduce", "all-to-all": "all_to_all"}  # fmt: skip


def _kv_heads(model: ModelSpec) -> int:
    """K/V heads the attention core sees (MLA expands its latent to every head)."""
    return model.num_heads if model.mla is not None else model.num_kv_heads


def _head_split(strategy: Strategy) -> int:
    """The tp degree that splits heads: ``tp``, or ``tp_y`` in 2-D (``tp_x`` splits the
    sequence of the queries instead)."""
    return strategy.tp_y if strategy.tp_y > 1 else strategy.tp


def tp_collectives(model: ModelSpec, strategy: Strategy, part: str) -> PassComms:
    """Tensor-parallel collectives of ``part`` ("embedding", "dense", "moe" or "head") on
    one device for one micro-batch, one forward and one backward pass; ``count`` merges
    equal ones.

    Derived from the part's SBP layout (``layout.part_layout``, checked against DTensor),
    the one place that says what a tensor layout sends: each collective on a
    tensor-parallel axis, its bytes per device turned back into the bytes of the tensor
    the group holds. Context parallelism's traffic is the ring's, priced in
    ``layer_work``. A layout the strategy has none for (2-D tp of an MoE layer, etp other
    than 1 or tp) is a one-line StrategyError."""
    s = strategy
    if s.tp == 1:
        return PassComms((), ())
    # ep folded over the tp ranks (etp = 1, each rank routes its own sequence shard): the
    # routed experts move nothing on the tp axes, as with the experts whole on every tp
    # rank; their all-to-alls are ``cost.moe_layer_time``'s
    ep = 1 if s.folded_ep else s.ep
    return _layout_collectives(model, part, s.dp, s.cp, s.tp, s.tp_y, s.sp, ep, s.etp, s.mbs,
                               s.dtype)  # fmt: skip


# The fields a part's layout reads (``layout.sbp_layout``): the planner scores thousands
# of strategies that differ only in others (ZeRO stage, recompute, schedule).
@lru_cache(maxsize=4096)
def _layout_collectives(
    model: ModelSpec, part: str, dp: int, cp: int, tp: int, tp_y: int, sp: bool, ep: int,
    etp: int, mbs: int, dtype: str,
) -> PassComms:  # fmt: skip
    s = Strategy(dp=dp, cp=cp, tp=tp, tp_y=tp_y, sp=sp, ep=ep, etp=etp, mbs=mbs, gbs=mbs * dp,
                 dtype=dtype)  # fmt: skip
    try:
        layout = part_layout(model, s, part)
    except LayoutError as exc:
        raise StrategyError(f"strategy: {exc}") from None
    sizes = {"tp": s.tp, "tp_x": s.tp_x, "tp_y": s.tp_y}
    return PassComms(
        _merged(forward_collectives(layout), sizes), _merged(backward_collectives(layout), sizes)
    )


def _merged(collectives: list[Collective], sizes: dict[str, int]) -> tuple[Comm, ...]:
    """The tensor-parallel ones as ``Comm`` (the group's tensor bytes), equal ones counted."""
    counts: Counter = Counter()
    for c in collectives:
        if c.axis in TP_AXES and c.bytes > 0:
            group = c.bytes / collective_bytes(c.kind, 1.0, sizes[c.axis])
            counts[(c.axis, _KINDS[c.kind], group)] += 1
    return tuple(Comm(axis, kind, nbytes, n) for (axis, kind, nbytes), n in counts.items())
