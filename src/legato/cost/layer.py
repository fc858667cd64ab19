"""Work of one transformer block for one micro-batch on one device.

The block's GEMMs with their per-device shapes, its attention core, its memory-bound
elementwise traffic, and the bytes it sends on each mesh axis, for a dense or an MoE
block under tensor (1-D or 2-D), sequence, context and expert parallelism.

Sharding assumptions (Megatron-style): tensor parallelism splits heads and FFN columns;
sequence parallelism splits the norm/residual tokens; context parallelism splits the
sequence with load-balanced causal chunks; routed experts are balanced over all devices of
a stage (tokens spread evenly over experts) and MoE blocks assume sequence parallelism
when ``tp > 1`` (tokens are dispatched from their TP shard). MLA's low-rank projections
are treated as one projection of the same total weight, split by ``tp``. 2-D tensor
parallelism splits the same FLOPs over ``tp`` devices (GEMM shapes as in 1-D); only its
communication differs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from legato.cost.compute import DeviceModel, Gemm
from legato.cost.runtime import Runtime, activation_bytes, op_bytes
from legato.specs.model import ModelSpec
from legato.specs.params import attention_params
from legato.specs.strategy import Strategy


@dataclass(frozen=True)
class Comm:
    """One collective per layer and pass: ``kind`` on ``axis`` of a ``nbytes`` tensor,
    ``count`` times."""

    axis: str
    kind: str
    nbytes: float
    count: int = 1


@dataclass(frozen=True)
class LayerWork:
    """Seconds and FLOPs of one block on one device for one micro-batch."""

    fwd_s: float  # GEMMs + attention + elementwise, forward
    bwd_input_s: float  # input-gradient GEMMs + attention backward + elementwise backward
    bwd_weight_s: float  # weight-gradient GEMMs (deferrable in zero-bubble schedules)
    attn_fwd_s: float  # attention core forward (selective recompute reruns it)
    attn_bwd_s: float
    overlap_fwd_s: float  # compute an EP all-to-all can hide behind (attention + shared)
    comms: tuple[Comm, ...] = field(default=())  # forward; the backward mirrors them


def head_dims(model: ModelSpec) -> tuple[int, int]:
    """(query/key, value) width of one attention head."""
    if model.mla is None:
        return model.head_dim, model.head_dim
    return model.mla.qk_nope_head_dim + model.mla.qk_rope_head_dim, model.mla.v_head_dim


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
    weights = model.with_(bias=False)
    proj = attention_params(weights)[0]
    out_w = model.num_heads * v_dim * h
    heads = model.num_heads / t

    gemms = [Gemm(tokens, (proj - out_w) / (h * t), h), Gemm(tokens, h, out_w / (h * t))]
    elementwise = 2 * (ops.norm + ops.residual) * tokens * h / sp_div
    qk_elements = tokens * (model.num_heads + model.num_kv_heads) * qk_dim / t
    if model.position == "rope":
        elementwise += ops.rope * qk_elements
    elementwise += ops.layout * (
        qk_elements + tokens * (model.num_kv_heads + model.num_heads) * v_dim / t
    )
    if runtime.flash_attention or c > 1:
        pairs = s * (s + 1) / 2 / c
        attn_fwd = device.attention_time(2 * b * heads * pairs * (qk_dim + v_dim))
        attn_bwd = 2.5 * attn_fwd  # the backward recomputes the scores: 5 matmuls vs 2
    else:
        scores = [Gemm(s, s, qk_dim, b * heads), Gemm(s, v_dim, s, b * heads)]
        softmax_bytes = (2 * d + (2 * d + 1) * mask) * b * heads * s * s
        attn_fwd = sum(device.gemm_time(g) for g in scores) + device.memory_time(softmax_bytes)
        attn_bwd = sum(device.gemm_time(x) for g in scores for x in g.backward())
        attn_bwd += device.memory_time(2 * softmax_bytes)

    n_in = 2 if model.mlp == "swiglu" else 1
    overlap = attn_fwd
    comms: list[Comm] = _tp_comms(strategy, tokens * h * d)  # attention sub-block
    if is_moe:
        moe = model.moe
        routed = tokens * moe.top_k / t  # expert-token pairs this device computes
        f_e = moe.expert_ffn_hidden_size
        per_expert = routed * strategy.ep * strategy.etp / moe.num_experts
        gemms += [Gemm(tokens / t, moe.num_experts, h)]  # router on the local tokens
        gemms += [
            Gemm(per_expert, n_in * f_e / strategy.etp, h, moe.num_experts / strategy.ep),
            Gemm(per_expert, h, f_e / strategy.etp, moe.num_experts / strategy.ep),
        ]
        elementwise += ops.activation * routed * f_e + 4 * d * routed * h  # + permutes
        if moe.num_shared_experts:
            f_s = moe.num_shared_experts * moe.shared_expert_ffn_hidden_size
            shared = [Gemm(tokens, n_in * f_s / t, h), Gemm(tokens, h, f_s / t)]
            gemms += shared
            elementwise += ops.activation * tokens * f_s / t
            overlap += sum(device.gemm_time(g) for g in shared)
        if strategy.ep > 1:
            comms.append(Comm("ep", "all_to_all", routed * h * d, 2))  # dispatch, combine
        if moe.num_shared_experts or strategy.etp > 1:  # these need the gathered tokens
            comms += _tp_comms(strategy, tokens * h * d)
    else:
        f = model.ffn_hidden_size
        gemms += [Gemm(tokens, n_in * f / t, h), Gemm(tokens, h, f / t)]
        elementwise += ops.activation * tokens * f / t
        comms += _tp_comms(strategy, tokens * h * d)
    if c > 1:
        kv_bytes = b * (s / c) * model.num_kv_heads / t * (qk_dim + v_dim) * d  # K and V
        comms.append(Comm("cp", "p2p", kv_bytes, c - 1))

    return _work(device, gemms, elementwise, comms, attn_fwd, attn_bwd, overlap)


def edge_work(
    model: ModelSpec, strategy: Strategy, device: DeviceModel, first: bool, last: bool
) -> LayerWork:
    """The embedding (first stage) and the LM head with its loss (last stage): the head
    GEMM over the vocabulary shard, fp32 logits written, read for softmax and written as
    gradients (4 fp32 passes plus the low-precision logits), the embedding gather."""
    s, t = model.seq_len, strategy.tp
    tokens = strategy.mbs * s / strategy.cp
    h, d = model.hidden_size, activation_bytes(strategy.dtype)
    gemms, elementwise, comms = [], 0.0, []
    if first:
        elementwise += 2 * d * tokens * h / (t if strategy.sp else 1)
        comms += _tp_comms(strategy, tokens * h * d)[-1:]  # embedding output: RS or AR
    if last:
        gemms.append(Gemm(tokens, model.vocab_size / t, h))
        elementwise += (d + 4 * 4) * tokens * model.vocab_size / t
        comms += _tp_comms(strategy, tokens * h * d)[:1]  # gather the head's input
    return _work(device, gemms, elementwise, comms, 0.0, 0.0, 0.0)


def _work(
    device: DeviceModel,
    gemms: list[Gemm],
    elementwise: float,
    comms: list[Comm],
    attn_fwd: float,
    attn_bwd: float,
    overlap: float,
) -> LayerWork:
    """Times of a set of GEMMs plus attention plus elementwise bytes; the backward runs two
    GEMMs per forward GEMM and moves twice the elementwise bytes (read the saved input and
    the incoming gradient, write the outgoing one)."""
    bwd = [g.backward() for g in gemms]
    ew = device.memory_time(elementwise)
    return LayerWork(
        fwd_s=sum(device.gemm_time(g) for g in gemms) + attn_fwd + ew,
        bwd_input_s=sum(device.gemm_time(dx) for dx, _ in bwd) + attn_bwd + 2 * ew,
        bwd_weight_s=sum(device.gemm_time(dw) for _, dw in bwd),
        attn_fwd_s=attn_fwd,
        attn_bwd_s=attn_bwd,
        overlap_fwd_s=overlap,
        comms=tuple(comms),
    )


def _tp_comms(strategy: Strategy, nbytes: float) -> list[Comm]:
    """Tensor-parallel collectives of one sub-block (attention or MLP), forward.

    1-D: an all-reduce of the block output, or with sequence parallelism an all-gather of
    its input and a reduce-scatter of its output. 2-D (Hypertron's weight-stationary
    layout): an all-gather and a reduce-scatter on each of the two axes, each of the
    activation split by the other axis, so traffic per device falls with the other degree.
    """
    s = strategy
    if s.tp == 1:
        return []
    if s.tp_y > 1:
        return [
            Comm("tp_x", "all_gather", nbytes / s.tp_y),
            Comm("tp_x", "reduce_scatter", nbytes / s.tp_y),
            Comm("tp_y", "all_gather", nbytes / s.tp_x),
            Comm("tp_y", "reduce_scatter", nbytes / s.tp_x),
        ]
    if s.sp:
        return [Comm("tp", "all_gather", nbytes), Comm("tp", "reduce_scatter", nbytes)]
    return [Comm("tp", "all_reduce", nbytes)]
