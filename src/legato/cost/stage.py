"""One pipeline device's share of a step: its time per micro-batch and its peak memory.

A device holds some dense and MoE blocks (and the embedding on the first stage, the LM
head on the last). Per micro-batch it computes its blocks' forward and backward (plus
recompute), sends its tensor-parallel collectives and pipeline activations on the critical
path, and hides context- and expert-parallel traffic behind attention (and shared
experts). Once per step it reduces gradients over the data-parallel ranks and runs the
optimizer. ``cost.overlap`` decides what stays exposed.
"""

from __future__ import annotations

from dataclasses import dataclass

from legato.cost.calibration import Calibration
from legato.cost.collectives import collective_time
from legato.cost.compute import DeviceModel
from legato.cost.layer import Comm, LayerWork, edge_work, layer_work
from legato.cost.memory import (
    GIB,
    DeviceParams,
    MemoryBreakdown,
    block_activations,
    block_params,
    comm_buffer_bytes,
    edge_params,
    grad_bytes,
    logits_bytes,
    model_states,
    state_bytes,
)
from legato.cost.mesh import Axis, mesh_axes
from legato.cost.overlap import Traffic, exposed_seconds
from legato.cost.pipeline import in_flight_microbatches, p2p_messages
from legato.cost.runtime import Runtime, activation_bytes
from legato.specs.cluster import ClusterSpec
from legato.specs.model import ModelSpec
from legato.specs.strategy import Strategy

CRITICAL = ("tp", "tp_x", "tp_y", "pp")


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
    overlap: bool

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
        return cls(
            model=model,
            strategy=strategy,
            runtime=runtime,
            calibration=calibration,
            device=device,
            axes=mesh_axes(strategy, cluster),
            works={k: layer_work(model, k, strategy, runtime, device) for k in kinds},
            blocks={k: block_params(model, i, strategy) for k, i in kinds.items()},
            overlap=overlap,
        )

    def comm_seconds(self, comms: tuple[Comm, ...]) -> dict[str, float]:
        out: dict[str, float] = {}
        for c in comms:
            axis = self.axes[c.axis]
            t = collective_time(c.kind, c.nbytes, axis.size, axis.link(c.kind), self.calibration)
            out[c.axis] = out.get(c.axis, 0.0) + c.count * t
        return out

    def collective(self, kind: str, nbytes: float, axis: str) -> float:
        a = self.axes[axis]
        return collective_time(kind, nbytes, a.size, a.link(kind), self.calibration)


def pipeline_stages(model: ModelSpec, s: Strategy) -> list[Stage]:
    """Every pipeline device in order: chunk ``c p + r`` on device ``r`` (interleaved,
    SVPP), chunks ``r`` and ``2p - 1 - r`` for ZB-V's V shape (so device 0 holds both the
    embedding and the LM head)."""
    p, chunks = s.pp, s.pp * s.vpp
    per_chunk = model.num_layers // chunks
    moe_in_chunk = [
        sum(model.is_moe_layer(i) for i in range(c * per_chunk, (c + 1) * per_chunk))
        for c in range(chunks)
    ]
    v_shape = s.schedule == "zb-v" and s.vpp == 2
    stages = []
    for r in range(p):
        mine = [r, 2 * p - 1 - r] if v_shape else [c * p + r for c in range(s.vpp)]
        moe = sum(moe_in_chunk[c] for c in mine)
        last = r == 0 if v_shape else r == p - 1
        stages.append(Stage(per_chunk * len(mine) - moe, moe, r == 0, last))
    return stages


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
    """Times of one device: per micro-batch, then exposed traffic after overlap."""
    s, m = ctx.strategy, ctx.strategy.num_microbatches
    counts = [(ctx.works[k], n) for k, n in ((False, stage.dense), (True, stage.moe)) if n]
    edge = edge_work(ctx.model, s, ctx.device, stage.first, stage.last)
    fwd = edge.fwd_s + sum(w.fwd_s * n for w, n in counts)
    bwd_w = edge.bwd_weight_s + sum(w.bwd_weight_s * n for w, n in counts)
    bwd = edge.bwd_input_s + bwd_w + sum(w.bwd_input_s * n for w, n in counts)
    full = s.recompute == "full"
    if full:
        recompute = sum(w.fwd_s * n for w, n in counts)
    elif s.recompute == "selective":
        recompute = sum(w.attn_fwd_s * n for w, n in counts)
    else:
        recompute = 0.0

    # Per micro-batch: traffic per axis (forward + backward + recomputed forward) and the
    # compute the overlappable axes hide behind.
    comm: dict[str, float] = {}
    _add(comm, ctx.comm_seconds(edge.comms), 1)
    _add(comm, ctx.comm_seconds(edge.bwd_comms), 1)
    window = {"cp": 0.0, "ep": 0.0}
    for w, n in counts:
        _add(comm, ctx.comm_seconds(w.comms), n * (1 + full))  # forward, recomputed forward
        _add(comm, ctx.comm_seconds(w.bwd_comms), n)
        window["cp"] += n * ((1 + full) * w.attn_fwd_s + w.attn_bwd_s)
        window["ep"] += n * (3 + full) * w.overlap_fwd_s
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
            0.0 if axis in CRITICAL or not ctx.overlap else m * window[axis],
        )
        for axis, t in comm.items()
    ]
    held = _held(ctx, stage)
    layers = max(1, stage.dense + stage.moe)
    traffic += _dp_traffic(ctx, held, fwd, bwd + recompute, layers)
    exposed = exposed_seconds(traffic, span=m * (fwd + bwd + recompute))
    exposed_mb = {axis: exposed[axis] / m for axis in comm}
    critical = sum(exposed_mb.values())
    owned = held.total if s.zero == 0 else held.sharded(s)  # the optimizer updates these
    return StageStep(
        t_f=fwd + critical / 2,
        t_b=bwd + recompute + critical / 2,
        t_w=bwd_w,
        compute_mb=fwd + bwd,
        recompute_mb=recompute,
        exposed_mb=exposed_mb,
        comm_step={x.axis: x.seconds for x in traffic},
        exposed_step={a: exposed[a] for a in ("dp", "edp") if a in exposed},
        optimizer_s=ctx.device.memory_time(owned * ctx.calibration.optimizer_bytes_per_param),
    )


def _dp_traffic(
    ctx: Context, held: DeviceParams, fwd: float, bwd: float, layers: int
) -> list[Traffic]:
    """Gradient reduction (and ZeRO weight gathers) per step on the dp and edp axes.

    ZeRO-0 all-reduces gradients behind one micro-batch's backward (the last bucket
    cannot hide); ZeRO-1/2 reduce-scatter them there and all-gather the updated weights
    behind the next step's first forward; ZeRO-3 gathers weights before every forward
    and backward and reduce-scatters gradients after every backward, hiding behind all of
    them except the first gather and the last reduction.
    """
    s, m = ctx.strategy, ctx.strategy.num_microbatches
    w_bytes = state_bytes(s.dtype).weights
    g_bytes = grad_bytes(s, ctx.runtime)
    out = []
    for axis, n in (("dp", held.dense), ("edp", held.experts)):
        if axis not in ctx.axes or ctx.axes[axis].size == 1 or n == 0:
            continue
        reduce = ctx.collective("reduce_scatter", n * g_bytes, axis)
        gather = ctx.collective("all_gather", n * w_bytes, axis)
        if s.zero == 0:
            seconds = ctx.collective("all_reduce", n * g_bytes, axis)
            window, tail = bwd, seconds / layers
        elif s.zero in (1, 2):
            seconds, window, tail = reduce + gather, bwd + fwd, reduce / layers
        else:
            seconds, window = m * (2 * gather + reduce), m * (fwd + bwd)
            tail = (gather + reduce) / layers
        if not ctx.overlap:
            window = tail = 0.0
        out.append(Traffic(axis, ctx.axes[axis].level.name, seconds, window, tail))
    return out


def stage_memory(ctx: Context, stage: Stage, index: int) -> MemoryBreakdown:
    """Peak memory of pipeline device ``index``."""
    s, model = ctx.strategy, ctx.model
    weights, grads, optimizer = model_states(_held(ctx, stage), s)
    v = 2 if s.schedule == "zb-v" else s.vpp
    in_flight = in_flight_microbatches(
        s.schedule, s.pp, s.num_microbatches, v, s.slices, s.memory_cap, index
    )
    per_mb = 0.0
    working = 0.0  # one block's full activations while full recompute reruns it
    for is_moe, n in ((False, stage.dense), (True, stage.moe)):
        if n == 0:
            continue
        acts = block_activations(model, is_moe, s, ctx.runtime)
        per_mb += n * acts.stored(s.recompute)
        if s.recompute == "full":
            working = max(working, acts.none)
    activations = in_flight * per_mb + working
    if stage.last:
        activations += logits_bytes(model, s)
    largest = max(ctx.blocks.values(), key=lambda b: b.total)
    buffers = ctx.calibration.framework_gib * GIB + comm_buffer_bytes(largest, model, s)
    return MemoryBreakdown(weights, grads, optimizer, activations, buffers, index)
