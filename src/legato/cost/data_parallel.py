"""One device's data-parallel traffic in a step, unit by unit, as its framework runs it.

ZeRO-3/FSDP gathers each unit's weights before its forward and again before its backward
and reduce-scatters its gradients after the backward, every micro-batch. ZeRO-1/2 reduce
the gradients during the last micro-batch's backward and gather the updated weights
during the next step's first forward (every micro-batch with
``Runtime.per_microbatch_sync``: FSDP1's SHARD_GRAD_OP); ZeRO-0 all-reduces the gradients
during the last backward. Units are the runtime's (``Runtime.param_unit``: whole blocks,
or each block's linears for DeepSpeed), gradients are reduced per unit or in the
runtime's buckets, and ``cost.param_overlap`` says what each pass leaves exposed: a
gather hides only behind the compute between its issue and its use.

What is hidden is not free: the collective's CTAs hold ``Runtime.comm_sm_share`` of the
SMs, so the compute it hides behind runs that much slower, ``share / (1 - share)`` of
the hidden seconds (``contention``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from legato.cost.exposed_comm import Traffic
from legato.cost.layer import head_dims
from legato.cost.memory import DeviceParams, grad_bytes, state_bytes
from legato.cost.param_overlap import PassTime, Unit, bucket_ends, issue_anchors, run_pass
from legato.specs.model import ModelSpec
from legato.specs.params import attention_params, layer_params


@dataclass(frozen=True)
class Piece:
    """One piece of a device's model in forward order: its parameters (reduced over dp,
    experts over edp) and its forward and backward compute (recompute included)."""

    params: DeviceParams
    fwd_s: float
    bwd_s: float
    kind: str  # "dense", "moe" (blocks) or "edge" (embedding, LM head)


@dataclass(frozen=True)
class DPTraffic:
    """Per step: the traffic for ``exposed_comm`` (``window`` = hidden, ``tail`` =
    exposed), the compute lost to contention, and one line per pass kind of what hid
    behind what."""

    traffic: tuple[Traffic, ...]
    contention_s: float
    overlap: tuple[dict[str, Any], ...]


def linear_shares(model: ModelSpec, layer: int) -> list[float]:
    """Each submodule's share of block ``layer``'s parameters in execution order: QKV, the
    output projection, then the MLP's input and output linears (an MoE block's experts,
    shared experts and router as one): DeepSpeed gathers one submodule at a time. Norms
    ride with the MLP's input."""
    total = layer_params(model, layer)
    proj = attention_params(model)[0]
    out = model.num_heads * head_dims(model)[1] * model.hidden_size
    if model.is_moe_layer(layer):
        parts = [proj - out, out, total - proj]
    else:
        down = model.ffn_hidden_size * model.hidden_size
        parts = [proj - out, out, total - proj - down, down]
    return [x / total for x in parts]


def dp_traffic(ctx: Any, pieces: Sequence[Piece], shares: dict[str, list[float]]) -> DPTraffic:
    """The dp and edp traffic of one device holding ``pieces`` (forward order); ``shares``
    splits a piece of each kind into the runtime's units (absent: one unit). ``ctx`` is
    the stage's ``Context``."""
    s, runtime = ctx.strategy, ctx.runtime
    axes = [a for a in (("dp", "edp") if s.ep > 1 else ("dp",)) if ctx.axes[a].size > 1]
    if not axes:
        return DPTraffic((), 0.0, ())
    units = [
        (DeviceParams(p.params.dense * x, p.params.experts * x), p.fwd_s * x, p.bwd_s * x)
        for p in pieces
        for x in shares.get(p.kind, [1.0])
    ]
    owned = {a: [_on_axis(u[0], a, s.ep > 1) for u in units] for a in axes}
    w_bytes, g_bytes = state_bytes(s.dtype).weights, grad_bytes(s, runtime)
    # a device's blocks are alike: price each distinct collective once (the planner
    # scores thousands of candidates of a hundred blocks each)
    collective = cache(ctx.collective)
    reduce_kind = "all_reduce" if s.zero == 0 else "reduce_scatter"
    reduced = {  # backward order
        a: bucket_ends(owned[a][::-1], runtime.reduce_bucket(ctx.axes[a].size)) for a in axes
    }
    gathers = {a: [collective("all_gather", n * w_bytes, a) for n in owned[a]] for a in axes}
    reduces = {a: [collective(reduce_kind, n * g_bytes, a) for n in reduced[a]] for a in axes}
    gather = [sum(gathers[a][i] for a in axes) for i in range(len(units))]
    reduce = [sum(reduces[a][i] for a in axes) for i in range(len(units))]  # backward order
    per_axis = {a: sum(gathers[a]) + sum(reduces[a]) for a in axes}
    backward_gathers = gather[::-1] if s.zero == 3 else [0.0] * len(units)
    passes = {
        "forward": [Unit(u[1], g if s.zero else 0.0, 0.0, u[0].total)
                    for u, g in zip(units, gather, strict=True)],
        "backward": [Unit(u[2], g, r, u[0].total)
                     for u, g, r in zip(units[::-1], backward_gathers, reduce, strict=True)],
    }  # fmt: skip
    exposed = hidden = comm = 0.0
    overlap = []
    for name, count in _pass_counts(s.zero, s.num_microbatches // s.model_copies, runtime).items():
        t = _run(passes[name], runtime) if ctx.overlap else _serial(passes[name])
        if t.comm_s <= 0:
            continue
        exposed, hidden, comm = (
            exposed + count * t.exposed_s,
            hidden + count * t.hidden_s,
            comm + count * t.comm_s,
        )
        kinds = [k for k, on in (("all_gather", name == "forward" or s.zero == 3),
                                 (reduce_kind, name == "backward")) if on]  # fmt: skip
        overlap.append({
            "axes": "+".join(axes), "collective": " + ".join(kinds), "pass": name,
            "passes": count, "comm_s": count * t.comm_s, "hidden_s": count * t.hidden_s,
            "exposed_s": count * t.exposed_s,
            "behind": f"{name} compute of {len(units)} {runtime.param_unit} units, "
                      f"{_prefetch(runtime)}",
        })  # fmt: skip
    traffic = tuple(
        Traffic(a, ctx.axes[a].level.name, comm * x, hidden * x, exposed * x)
        for a, x in _proportions(per_axis).items()
    )
    contention = hidden * runtime.comm_sm_share / (1 - runtime.comm_sm_share)
    return DPTraffic(traffic, contention, tuple(overlap))


def _on_axis(params: DeviceParams, axis: str, expert_axis: bool) -> float:
    """Parameters of a unit reduced over ``axis``: experts over edp, the rest over dp
    (everything over dp without expert parallelism)."""
    if axis == "edp":
        return params.experts
    return params.dense if expert_axis else params.total


def _proportions(seconds: dict[str, float]) -> dict[str, float]:
    total = sum(seconds.values())
    return {a: (x / total if total > 0 else 0.0) for a, x in seconds.items()}


def _pass_counts(zero: int, m: int, runtime: Any) -> dict[str, int]:
    """How many forward and backward passes of a step carry data-parallel traffic."""
    if zero == 3:
        return {"forward": m, "backward": m}
    if zero in (1, 2):
        count = m if runtime.per_microbatch_sync else 1
        return {"forward": count, "backward": count}
    return {"backward": 1}


def _prefetch(runtime: Any) -> str:
    if runtime.prefetch_numel > 0:
        return f"prefetching up to {runtime.prefetch_numel:.3g} parameters"
    return f"prefetching {runtime.prefetch_units} unit{'s' * (runtime.prefetch_units > 1)} ahead"


def _serial(units: Sequence[Unit]) -> PassTime:
    """A pass with nothing overlapped: compute and communication back to back."""
    compute = sum(u.compute_s for u in units)
    comm = sum(u.gather_s + u.reduce_s for u in units)
    return PassTime(compute + comm, compute, comm)


def _run(units: Sequence[Unit], runtime: Any) -> PassTime:
    return run_pass(units, issue_anchors(units, runtime.prefetch_units, runtime.prefetch_numel))
