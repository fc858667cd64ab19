"""One pipeline device's share of a step: its time per micro-batch and its peak memory.

A device holds some dense and MoE blocks (and the embedding on the first stage, the LM
head on the last). Per micro-batch it computes its blocks' forward and backward (plus
recompute), sends its tensor-parallel collectives and pipeline activations on the critical
path, hides context-parallel traffic behind attention, and leaves exposed the part of its
expert-parallel all-to-alls that the strategy's MoE overlap schedule does not hide behind
the expert GEMMs (``cost.moe_layer_time``). With activation swap each block's saved
activations cross the host link, hidden behind that block's compute up to the excess
(``cost.xtuner_terms``), and the device keeps only the blocks in flight. Its data-parallel
gathers and reductions run unit by unit as its framework issues them
(``cost.data_parallel``); once per step it runs the optimizer. ``cost.exposed_comm``
decides what stays exposed, and what hides behind compute slows that compute by the SMs
the collective holds (``Runtime.comm_sm_share``: ``contention``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import lru_cache

from legato.cost.calibration import Calibration
from legato.cost.collectives import collective_time
from legato.cost.compute import DeviceModel
from legato.cost.data_parallel import DPTraffic, Piece, dp_traffic, linear_shares
from legato.cost.exposed_comm import Traffic, exposed_seconds
from legato.cost.layer import TP_AXES, Comm, LayerWork, edge_work, layer_work
from legato.cost.memory import (
    GIB,
    DeviceParams,
    MemoryBreakdown,
    block_params,
    comm_buffer_bytes,
    edge_params,
    grad_bytes,
    model_states,
    ops_recompute_share,
)
from legato.cost.mesh import Axis, mesh_axes
from legato.cost.moe_layer_time import EPExposure, ep_exposure
from legato.cost.pipeline import in_flight_microbatches, p2p_messages
from legato.cost.runtime import Runtime, activation_bytes
from legato.cost.xtuner_terms import block_stored, chunked_logits_bytes, swap_resident, swap_traffic
from legato.specs.cluster import ClusterSpec
from legato.specs.model import ModelSpec
from legato.specs.schedules import SCHEDULE_KINDS
from legato.specs.strategy import Strategy, stage_layers

CRITICAL = (*TP_AXES, "pp", "ep")  # ep: what its schedule leaves exposed
CRITICAL_WITH_TP_OVERLAP = ("pp", "ep")


@dataclass(frozen=True)
class Stage:
    """What one pipeline device holds: block counts, and the embedding / LM head."""

    dense: int
    moe: int
    first: bool
    last: bool


@dataclass(frozen=True)
class StageStep:
    """Per-micro-batch seconds of one device after overlap, and its once-per-step terms.
    ``t_f + t_b = compute_mb + recompute_mb + sum(exposed_mb)``."""

    t_f: float
    t_b: float
    t_w: float  # weight-gradient part of t_b
    compute_mb: float
    recompute_mb: float
    exposed_mb: dict[str, float]  # critical and exposed traffic per micro-batch, by axis
    comm_step: dict[str, float]  # all traffic of the step, by axis
    exposed_step: dict[str, float]  # exposed once-per-step traffic (data parallel)
    optimizer_s: float
    contention_mb: float = 0.0  # compute slowed by hidden per-micro-batch traffic (in t_f, t_b)
    contention_step: float = 0.0  # compute slowed by hidden data-parallel traffic
    classes_mb: dict[str, float] | None = None  # compute_mb by op class
    overlap: tuple[dict, ...] = ()  # what hid behind what, per traffic kind


@dataclass(frozen=True)
class Context:
    """Everything a stage needs, computed once per prediction."""

    model: ModelSpec
    strategy: Strategy
    runtime: Runtime
    calibration: Calibration
    device: DeviceModel
    axes: dict[str, Axis]
    works: dict[bool, LayerWork]  # by "is MoE"
    blocks: dict[bool, DeviceParams]  # one block's parameters on a device, by "is MoE"
    stored: dict[bool, tuple[float, float]]  # one block's activations: kept, all (recompute)
    ep: EPExposure | None  # one MoE layer's all-to-alls when ep > 1
    overlap: bool
    shares: dict[str, list[float]]  # a block's units under the runtime (DeepSpeed: linears)

    @classmethod
    def build(
        cls,
        model: ModelSpec,
        cluster: ClusterSpec,
        strategy: Strategy,
        runtime: Runtime,
        calibration: Calibration,
        overlap: bool,
    ) -> Context:
        device = DeviceModel.of(cluster.device, strategy.dtype, calibration)
        kinds = {model.is_moe_layer(i): i for i in reversed(range(model.num_layers))}
        axes = mesh_axes(strategy, cluster)
        fp8 = strategy.dtype == "fp8"
        ep = None
        if strategy.ep > 1 and True in kinds:
            link = axes["ep"].link("all_to_all")
            ep = ep_exposure(model, strategy, device, link, calibration, overlap)
        return cls(
            model=model,
            strategy=strategy,
            runtime=runtime,
            calibration=calibration,
            device=device,
            axes=axes,
            works={k: layer_work(model, k, strategy, runtime, device) for k in kinds},
            blocks={k: block_params(model, i, strategy) for k, i in kinds.items()},
            stored={k: block_stored(model, k, strategy, fp8, runtime) for k in kinds},
            ep=ep,
            overlap=overlap,
            shares=_unit_shares(model, kinds, runtime),
        )

    def comm_seconds(self, comms: tuple[Comm, ...]) -> dict[str, float]:
        out: dict[str, float] = {}
        for c in comms:
            axis = self.axes[c.axis]
            t = collective_time(c.kind, c.nbytes, axis.size, axis.link(c.kind), self.device.profile)
            out[c.axis] = out.get(c.axis, 0.0) + c.count * t
        return out

    def collective(self, kind: str, nbytes: float, axis: str) -> float:
        a = self.axes[axis]
        return collective_time(kind, nbytes, a.size, a.link(kind), self.device.profile)


def _unit_shares(
    model: ModelSpec, kinds: dict[bool, int], runtime: Runtime
) -> dict[str, list[float]]:
    """How the runtime splits a dense and an MoE block into gathered units."""
    if runtime.param_unit == "block":
        return {}
    return {("moe" if k else "dense"): linear_shares(model, layer) for k, layer in kinds.items()}


def block_recompute(ctx: Context, w: LayerWork, is_moe: bool) -> float:
    """Seconds one block's backward spends recomputing its forward: all of it (full), its
    attention core (Megatron's selective), the matmuls torchtitan's op-level policy does
    not keep and every elementwise op (``ops``), or every second block whole (``blocks``)."""
    s = ctx.strategy
    if s.recompute == "full":
        return w.fwd_s
    if s.recompute != "selective":
        return 0.0
    policy = ctx.runtime.selective
    if policy == "blocks":
        return w.fwd_s / 2
    if policy == "ops":
        return w.gemm_fwd_s * ops_recompute_share(ctx.model, is_moe) + w.memory_fwd_s
    return w.attn_fwd_s


def pipeline_stages(model: ModelSpec, s: Strategy) -> list[Stage]:
    """Every pipeline device in order: chunk ``c p + r`` on device ``r`` (interleaved,
    SVPP), chunks ``r`` and ``2p - 1 - r`` for ZB-V's V shape (so device 0 holds both the
    embedding and the LM head), and for DualPipe stages ``r`` and ``p - 1 - r`` of a
    ``p``-stage split, one per model copy (devices 0 and p - 1 hold both edges). Blocks per
    chunk as the runtime builds them (``stage_layers``: balanced, the extra layers on the
    earliest chunks, or the strategy's uneven split)."""
    p = s.pp
    dual = s.model_copies > 1
    counts = stage_layers(model.num_layers, s)
    moe_in_chunk = _moe_layers_per_chunk(model, counts)
    v, v_shape = len(counts) // p, s.schedule == "zb-v"  # ZB-V: a V of 2 chunks
    stages = []
    for r in range(p):
        if dual:
            mine, first = [r, p - 1 - r], r in (0, p - 1)
            last = first
        else:
            mine = [r, 2 * p - 1 - r] if v_shape else [c * p + r for c in range(v)]
            first, last = r == 0, (r == 0 if v_shape else r == p - 1)
        moe = sum(moe_in_chunk[c] for c in mine)
        stages.append(Stage(sum(counts[c] for c in mine) - moe, moe, first, last))
    return stages


@lru_cache(maxsize=1024)
def _moe_layers_per_chunk(model: ModelSpec, counts: tuple[int, ...]) -> tuple[int, ...]:
    if model.moe is None:
        return (0,) * len(counts)
    starts = [sum(counts[:i]) for i in range(len(counts))]
    return tuple(
        sum(model.is_moe_layer(i) for i in range(start, start + n))
        for start, n in zip(starts, counts, strict=True)
    )


def _held(ctx: Context, stage: Stage) -> DeviceParams:
    dense = edge_params(ctx.model, ctx.strategy, stage.first, stage.last)
    experts = 0.0
    for is_moe, n in ((False, stage.dense), (True, stage.moe)):
        if n:
            dense += ctx.blocks[is_moe].dense * n
            experts += ctx.blocks[is_moe].experts * n
    return DeviceParams(dense, experts)


def _add(total: dict[str, float], part: dict[str, float], times: float) -> None:
    for axis, seconds in part.items():
        total[axis] = total.get(axis, 0.0) + seconds * times


def stage_step(ctx: Context, stage: Stage) -> StageStep:
    """Times of one device: per micro-batch, then exposed traffic after overlap.

    Under DualPipe the device holds two chunks and each micro-batch crosses one, so the
    step is ``m / 2`` passes of both; the per-micro-batch times are halved at the end, and
    the two copies' gradients are summed between mirror devices once per step."""
    s = ctx.strategy
    twins = s.model_copies
    m = s.num_microbatches // twins  # passes through all of the device's chunks
    counts = [(ctx.works[k], n) for k, n in ((False, stage.dense), (True, stage.moe)) if n]
    edge = edge_work(ctx.model, s, ctx.device, stage.first, stage.last, ctx.runtime)
    fwd = edge.fwd_s + sum(w.fwd_s * n for w, n in counts)
    bwd_w = edge.bwd_weight_s + sum(w.bwd_weight_s * n for w, n in counts)
    bwd = edge.bwd_input_s + bwd_w + sum(w.bwd_input_s * n for w, n in counts)
    full = s.recompute == "full"
    kinds = [(k, ctx.works[k], n) for k, n in ((False, stage.dense), (True, stage.moe)) if n]
    recompute = sum(block_recompute(ctx, w, k) * n for k, w, n in kinds)

    # Per micro-batch: traffic per axis (forward + backward + recomputed forward) and the
    # compute the overlappable axes hide behind.
    comm: dict[str, float] = {}
    _add(comm, ctx.comm_seconds(edge.comms), 1)
    _add(comm, ctx.comm_seconds(edge.bwd_comms), 1)
    window = dict.fromkeys(("cp", *TP_AXES), 0.0)
    for w, n in counts:
        _add(comm, ctx.comm_seconds(w.comms), n * (1 + full))  # forward, recomputed forward
        _add(comm, ctx.comm_seconds(w.bwd_comms), n)
        attention = (1 + full) * w.attn_fwd_s + w.attn_bwd_s
        passes = (1 + full) * w.fwd_s + w.bwd_input_s + w.bwd_weight_s
        window["cp"] += n * attention
        for axis in TP_AXES:  # with comm-GEMM overlap: behind all but the attention core
            window[axis] += n * (passes - attention)
    on_path = CRITICAL_WITH_TP_OVERLAP if ctx.runtime.tp_comm_overlap else CRITICAL
    if twins > 1:  # DualPipe: paired F&B chunks hide each other's ep and pp traffic
        on_path = tuple(a for a in on_path if a not in ("ep", "pp"))
        window["ep"] = window["pp"] = _paired_share(s) * (fwd + bwd + recompute)
    ep_total = 0.0
    if ctx.ep is not None and stage.moe:
        e, n = ctx.ep, stage.moe
        fwd += n * e.extra_forward_s  # smaller GEMM pieces run less efficiently
        bwd += n * e.extra_backward_s
        recompute += n * e.extra_forward_s if full else 0.0
        timed = e.timed
        comm["ep"] = n * ((1 + full) * timed.exposed_forward_s + timed.exposed_backward_s)
        ep_total = n * (timed.comm_s + full * timed.forward_comm_s)
    if s.pp > 1:
        d = activation_bytes(s.dtype)
        message = s.mbs * ctx.model.seq_len / s.cp * ctx.model.hidden_size * d / s.tp / s.slices
        sends = p2p_messages(s.schedule, s.vpp, s.slices)
        comm["pp"] = 2 * sends * ctx.collective("p2p", message, "pp")

    traffic = [
        Traffic(
            axis,
            ctx.axes[axis].level.name,
            m * t,
            0.0 if axis in on_path or not ctx.overlap else m * window[axis],
        )
        for axis, t in comm.items()
    ]
    held = _held(ctx, stage)
    dp = _data_parallel(ctx, stage)
    traffic += dp.traffic
    exposed = exposed_seconds(traffic, span=m * (fwd + bwd + recompute))
    exposed_mb = {axis: exposed[axis] / m for axis in comm}
    hidden_mb = sum(
        max(0.0, x.seconds - exposed[x.axis]) / m for x in traffic if x.axis in comm and x.window
    )
    share = ctx.runtime.comm_sm_share
    contention_mb = hidden_mb * share / (1 - share)
    comm_step = {x.axis: x.seconds for x in traffic}
    if ep_total:
        comm_step["ep"] = m * ep_total  # all of it; only the exposed part is in ``comm``
    if s.swap:
        copies, exposed_mb["host"] = _swap_seconds(ctx, stage, full)
        comm_step["host"] = m * copies
    critical = sum(exposed_mb.values()) + contention_mb
    owned = held.total if s.zero == 0 else held.sharded(s)  # the optimizer updates these
    exposed_step = {a: exposed[a] for a in ("dp", "edp") if a in exposed}
    if twins > 1:
        comm_step["copies"] = exposed_step["copies"] = _copies_sum(ctx, held)
    per_mb = 1 / twins
    return StageStep(
        t_f=(fwd + critical / 2) * per_mb,
        t_b=(bwd + recompute + critical / 2) * per_mb,
        t_w=bwd_w * per_mb,
        compute_mb=(fwd + bwd) * per_mb,
        recompute_mb=recompute * per_mb,
        exposed_mb={axis: t * per_mb for axis, t in exposed_mb.items()},
        comm_step=comm_step,
        exposed_step=exposed_step,
        optimizer_s=ctx.device.memory_time(owned * ctx.calibration.optimizer_bytes_per_param),
        contention_mb=contention_mb * per_mb,
        contention_step=dp.contention_s,
        classes_mb={k: t * per_mb for k, t in _classes(edge, counts, fwd + bwd).items()},
        overlap=tuple(dict(line) for line in dp.overlap),  # the memo's stay as they are
    )


def _paired_share(s: Strategy) -> float:
    """DualPipe: the share of an end device's chunks that run as an overlapped forward-
    backward pair (the steady state, ``m - 2p + 2`` of its ``m``), where one micro-batch's
    all-to-alls and pipeline sends hide behind the other's compute (DeepSeek-V3, 3.2.1);
    warm-up and drain chunks run alone. Devices nearer the middle pair more."""
    m = s.num_microbatches
    return max(0.0, m - 2 * s.pp + 2) / m


def _copies_sum(ctx: Context, held: DeviceParams) -> float:
    """DualPipe: device r's and device p - 1 - r's copies of the same layers sum their
    gradients once per step, an all-reduce between the two over the pipeline's link."""
    s = ctx.strategy
    params = held.total if s.zero < 2 else held.sharded(s)  # ZeRO-2/3 reduce shards
    nbytes = params * grad_bytes(s, ctx.runtime)
    link = ctx.axes["pp"].link("all_reduce")
    return collective_time("all_reduce", nbytes, 2, link, ctx.device.profile)


# Strategy fields a device's pieces and their data-parallel traffic depend on: all but
# those that only order the pipeline's micro-batches (schedule, vpp, slices, memory_cap;
# the model copies the schedule keeps, DualPipe's two, enter the key apart) and those
# that only hide expert-parallel all-to-alls (moe_overlap and its pieces).
_NOT_DP = ("schedule", "vpp", "slices", "memory_cap", "moe_overlap", "moe_chunks", "moe_groups")
_DP_FIELDS = tuple(f.name for f in fields(Strategy) if f.name not in _NOT_DP)
_DP_MEMO: dict[tuple, DPTraffic] = {}
_DP_MEMO_SIZE = 8192


def _data_parallel(ctx: Context, stage: Stage) -> DPTraffic:
    """``dp_traffic`` of the device holding ``stage``, memoised on everything its pieces
    and their collectives derive from: the planner scores each device layout under many
    schedules, and simulating its passes unit by unit is most of a prediction's time."""
    s = ctx.strategy
    key = (
        stage,
        ctx.model,
        s.model_copies,
        *(getattr(s, name) for name in _DP_FIELDS),
        ctx.runtime,
        ctx.calibration,
        ctx.device,
        ctx.overlap,
        tuple(ctx.axes.items()),
    )
    if key not in _DP_MEMO:
        if len(_DP_MEMO) >= _DP_MEMO_SIZE:
            _DP_MEMO.clear()
        _DP_MEMO[key] = dp_traffic(ctx, _pieces(ctx, stage), ctx.shares)
    return _DP_MEMO[key]


def _classes(edge: LayerWork, counts: list[tuple[LayerWork, int]], total: float) -> dict:
    """One micro-batch's compute by op class; MoE's expert-parallel GEMM-splitting extra
    (what is left of ``total``) is counted as GEMM time."""
    out: dict[str, float] = {}
    for work, n in [(edge, 1), *counts]:
        for name, seconds in work.classes:
            out[name] = out.get(name, 0.0) + n * seconds
    out["gemm"] = out.get("gemm", 0.0) + total - sum(out.values())
    return out


def _pieces(ctx: Context, stage: Stage) -> list[Piece]:
    """The device's model in forward order for its data-parallel traffic: the embedding,
    the blocks (dense, then MoE), the LM head."""
    s, model = ctx.strategy, ctx.model
    pieces = []
    if stage.first:
        e = edge_work(model, s, ctx.device, True, False, ctx.runtime)
        params = edge_params(model, s, True, False)
        pieces.append(
            Piece(DeviceParams(params, 0.0), e.fwd_s, e.bwd_input_s + e.bwd_weight_s, "edge")
        )
    for is_moe, n in ((False, stage.dense), (True, stage.moe)):
        w = ctx.works.get(is_moe)
        if w is None or n == 0:
            continue
        bwd = w.bwd_input_s + w.bwd_weight_s + block_recompute(ctx, w, is_moe)
        kind = "moe" if is_moe else "dense"
        pieces += [Piece(ctx.blocks[is_moe], w.fwd_s, bwd, kind)] * n
    if stage.last:
        e = edge_work(model, s, ctx.device, False, True, ctx.runtime)
        params = edge_params(model, s, stage.first, True) - edge_params(
            model, s, stage.first, False
        )
        pieces.append(
            Piece(DeviceParams(params, 0.0), e.fwd_s, e.bwd_input_s + e.bwd_weight_s, "edge")
        )
    return pieces


def _swap_seconds(ctx: Context, stage: Stage, full: bool) -> tuple[float, float]:
    """Host-link seconds of one micro-batch's swap (every block out and back) and the part
    its blocks' forward and backward (with recompute) do not hide."""
    gbps = ctx.runtime.host_link_gbps
    copies = exposed = 0.0
    for is_moe, n in ((False, stage.dense), (True, stage.moe)):
        if n == 0:
            continue
        w, stored = ctx.works[is_moe], ctx.stored[is_moe][0]
        backward = w.bwd_input_s + w.bwd_weight_s + (w.fwd_s if full else 0.0)
        exposed += swap_traffic(stored, w.fwd_s, n, gbps, backward).exposed_s
        copies += 2 * n * stored / (gbps * 1e9)
    return copies, exposed if ctx.overlap else copies


def stage_memory(ctx: Context, stage: Stage, index: int) -> MemoryBreakdown:
    """Peak memory of pipeline device ``index``."""
    s, model = ctx.strategy, ctx.model
    weights, grads, optimizer = model_states(_held(ctx, stage), s)
    v = SCHEDULE_KINDS[s.schedule].chunks_for(s.vpp)
    in_flight = in_flight_microbatches(
        s.schedule, s.pp, s.num_microbatches, v, s.slices, s.memory_cap, index
    )
    stored: list[float] = []  # each block's kept activations for one micro-batch
    working = 0.0  # one block's full activations while full recompute reruns it
    for is_moe, n in ((False, stage.dense), (True, stage.moe)):
        if n == 0:
            continue
        kept, everything = ctx.stored[is_moe]
        stored += [kept] * n
        if s.recompute == "full":
            working = max(working, everything)
        elif s.recompute == "selective" and ctx.runtime.selective != "attention":
            working = max(working, everything - kept)  # one block's recomputed ops
    activations = in_flight * sum(stored)
    host = 0.0
    if s.swap:  # only the blocks in flight stay; the rest of every micro-batch is on host
        resident = min(activations, swap_resident(stored))
        host, activations = activations - resident, resident
    activations += working
    if stage.last:
        activations += chunked_logits_bytes(model, s, s.loss_chunk, ctx.runtime.loss_bytes)
    largest = max(ctx.blocks.values(), key=lambda b: b.total)
    buffers = ctx.calibration.framework_gib * GIB + comm_buffer_bytes(largest, model, s)
    return MemoryBreakdown(weights, grads, optimizer, activations, buffers, index, host)
