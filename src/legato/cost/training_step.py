"""predict: step time, throughput, utilisation and memory of one training configuration.

The step is the pipeline schedule's closed form (``cost.pipeline``) over the slowest
device's per-micro-batch forward and backward (``cost.stage``: compute, recompute,
critical and exposed communication), plus the exposed data-parallel traffic and the
optimizer step of the device where they are largest. So that the terms explain the step:
``step_time_s = compute_s + recompute_s + contention_s + sum(exposed_comm_s) + bubble_s +
optimizer_s``, ``contention_s`` being what hidden communication slows the compute it hides
behind (``Runtime.comm_sm_share``). ``breakdown["compute_by_class_s"]`` splits
``compute_s`` by op class, ``breakdown["overlap"]`` says what each kind of traffic hid
behind and what it left exposed, ``breakdown["collectives"]`` how each axis's collectives
run.

Device techniques of the strategy enter as their own terms: the expert-parallel axis
``ep`` carries what the MoE overlap schedule leaves exposed (``breakdown["moe_overlap"]``
has the per-layer times of the schedule and of plain), the ``host`` axis the swap copies
the compute does not hide (``breakdown["swap"]`` the bytes parked on the host),
``loss_chunk`` shrinks the logits in the activations term, and ``dtype="fp8"`` runs the
block linears at the fp8 peak with FP8-cached inputs (MFU and HFU stay relative to the
bf16 peak, so they compare across precisions).
"""

from __future__ import annotations

from typing import Any

from legato.cost.calibration import CALIBRATION, Calibration
from legato.cost.flops import training_step_flops
from legato.cost.memory import GIB, TERMS, MemoryBreakdown
from legato.cost.mesh import Axis
from legato.cost.moe_layer_time import MoETime
from legato.cost.pipeline import pipeline_time
from legato.cost.prediction import Prediction
from legato.cost.runtime import Runtime
from legato.cost.stage import Context, Stage, StageStep, pipeline_stages, stage_memory, stage_step
from legato.specs.cluster import ClusterSpec
from legato.specs.model import ModelSpec
from legato.specs.schedules import SCHEDULE_KINDS
from legato.specs.strategy import Strategy


def predict(
    model: ModelSpec,
    cluster: ClusterSpec,
    strategy: Strategy,
    *,
    overlap: bool = True,
    runtime: Runtime | None = None,
    calibration: Calibration = CALIBRATION,
) -> Prediction:
    """Predict one training step of ``model`` on ``cluster`` split by ``strategy``.

    Raises StrategyError (one line) when the strategy does not fit the model or the
    device count; a configuration that does not fit in memory is returned with
    ``fits=False`` and ``why_not_fits`` naming the largest term. ``overlap=False`` puts
    every collective on the critical path. ``runtime`` describes the kernels (fused
    attention, dropout, gradient reduction dtype); ``calibration`` the tuned constants.
    """
    strategy.check(model, cluster.world_size)
    ctx = Context.build(model, cluster, strategy, runtime or Runtime(), calibration, overlap)
    stages = pipeline_stages(model, strategy)
    steps: dict[Stage, StageStep] = {}
    memories: dict[Stage, MemoryBreakdown] = {}  # first (most loaded) device of each kind
    for index, stage in enumerate(stages):
        if stage not in steps:
            steps[stage] = stage_step(ctx, stage)
            memories[stage] = stage_memory(ctx, stage, index)
    slowest = max(steps.values(), key=lambda x: x.t_f + x.t_b)
    m = strategy.num_microbatches
    chunks = SCHEDULE_KINDS[strategy.schedule].chunks_for(strategy.vpp)
    pipe = pipeline_time(
        strategy.schedule,
        strategy.pp,
        m,
        chunks,
        strategy.slices,
        slowest.t_f,
        slowest.t_b,
        slowest.t_w,
        strategy.memory_cap,
    )
    bubble = pipe.bubble_s / ctx.runtime.bubble_speedup
    dp_device = max(
        steps.values(),
        key=lambda x: sum(x.exposed_step.values()) + x.optimizer_s + x.contention_step,
    )
    step = pipe.total_s - pipe.bubble_s + bubble
    step += sum(dp_device.exposed_step.values()) + dp_device.optimizer_s
    step += dp_device.contention_step

    exposed = {axis: m * t for axis, t in slowest.exposed_mb.items()}
    exposed.update(dp_device.exposed_step)
    comm = {axis: t for axis, t in slowest.comm_step.items() if t > 0}
    comm.update({a: dp_device.comm_step[a] for a in dp_device.exposed_step})
    memory = max(memories.values(), key=lambda x: x.total)
    capacity = cluster.device.memory_gib
    fits = memory.total / GIB <= capacity

    flash = ctx.runtime.flash_attention or strategy.cp > 1
    seq = model.seq_len
    model_flops = training_step_flops(model, strategy.gbs, seq)
    hw_flops = training_step_flops(model, strategy.gbs, seq, strategy.recompute, causal=flash)
    peak = ctx.device.peak_flops * cluster.world_size
    host = max(memories.values(), key=lambda x: x.host).host
    breakdown = {
        "compute_s": m * slowest.compute_mb,
        "recompute_s": m * slowest.recompute_mb,
        "contention_s": m * slowest.contention_mb + dp_device.contention_step,
        "bubble_s": bubble,
        "optimizer_s": dp_device.optimizer_s,
        "exposed_comm_s": {axis: t for axis, t in exposed.items() if t > 0},
        "comm_s": comm,
        "memory_gib": memory.gib(),
        "memory_stage": memory.stage,
        "microbatches": m,
        "levels": {a: x.level.name for a, x in ctx.axes.items() if x.size > 1},
        "compute_by_class_s": {k: m * v for k, v in (slowest.classes_mb or {}).items()},
        "overlap": [*_overlap_lines(slowest, m, strategy.model_copies > 1), *dp_device.overlap],
        "collectives": {a: _algorithm(x) for a, x in ctx.axes.items() if x.size > 1},
        "runtime_profile": ctx.runtime.profile or "none (defaults)",
    }
    if ctx.ep is not None:
        breakdown["moe_overlap"] = _moe_overlap_terms(ctx.ep.timed, ctx.ep.plain)
    if strategy.swap:
        breakdown["swap"] = {
            "host_gib": host / GIB,
            "host_link_s": slowest.comm_step.get("host", 0.0),
        }
    return Prediction(
        step_time_s=step,
        tokens_per_s=strategy.gbs * seq / step,
        mfu=model_flops / (step * peak),
        hfu=hw_flops / (step * peak),
        tflops_per_device=hw_flops / (step * cluster.world_size) / 1e12,
        memory_gib=memory.total / GIB,
        fits=fits,
        why_not_fits="" if fits else _why_not_fits(memory, capacity),
        breakdown=breakdown,
    )


def _overlap_lines(step: StageStep, m: int, paired: bool) -> list[dict[str, Any]]:
    """Per-micro-batch traffic of the slowest device: what is exposed of it (tensor and
    pipeline traffic is on the critical path unless the runtime overlaps it; DualPipe
    hides expert and pipeline traffic behind the paired micro-batch)."""
    lines = []
    for axis, exposed in step.exposed_mb.items():
        total = step.comm_step.get(axis, 0.0)
        if total <= 0 or axis == "host":
            continue
        lines.append({
            "axes": axis, "pass": "every micro-batch", "comm_s": total,
            "hidden_s": max(0.0, total - m * exposed), "exposed_s": m * exposed,
            "behind": f"the {'paired' if paired and axis in ('ep', 'pp') else 'same'} "
            "micro-batch's compute" if total > m * exposed
            else "nothing: on the critical path",
        })  # fmt: skip
    return lines


def _algorithm(axis: Axis) -> str:
    """How an axis's collectives run: a ring over its slowest link, hierarchical when the
    group spans several devices of each domain below it (``cost.mesh``)."""
    if axis.name == "pp":
        return f"point-to-point over {axis.level.name}"
    ring = "hierarchical ring" if axis.ring != axis.level else "ring"
    return f"{ring} over {axis.level.name} ({axis.ring.bandwidth_gbps:g} GB/s per device)"


def _moe_overlap_terms(timed: MoETime, plain: MoETime) -> dict[str, Any]:
    """One MoE layer's routed experts and all-to-alls per micro-batch, forward and
    backward: the strategy's schedule against plain."""
    return {
        "schedule": timed.schedule,
        "chunks": timed.chunks,
        "groups": timed.groups,
        "layer_s": timed.seconds,
        "plain_layer_s": plain.seconds,
        "comm_s": timed.comm_s,
        "exposed_s": timed.exposed_comm_s,
        "hidden_fraction": timed.hidden_fraction,
    }


def _why_not_fits(memory: MemoryBreakdown, capacity_gib: float) -> str:
    gib = memory.gib()
    largest = max(TERMS, key=gib.get)
    return (
        f"needs {memory.total / GIB:.1f} GiB on pipeline stage {memory.stage} but the device "
        f"has {capacity_gib:g} GiB; the largest term is {largest} ({gib[largest]:.1f} GiB)"
    )
