"""Explanations: where a plan's step time goes, why the runner-up lost, why nothing fits.

Figures come from the cost model's breakdown (compute, pipeline bubble, exposed
communication per mesh axis, memory per device by term); the per-layer bytes each axis
moves come from the plan's SBP layout, so the two views can be read side by side.
Device techniques a plan uses (MoE overlap schedule, activation swap, chunked loss, FP8)
are named with what they buy or cost, from the same breakdown.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from legato.layout import LayoutError, backward_collectives, forward_collectives, part_layout
from legato.plan.search import Scored
from legato.schedule.builders import default_memory_cap
from legato.specs.model import ModelSpec


def time_terms(scored: Scored) -> dict[str, float]:
    """Seconds per step by term: every ``*_s`` number of the breakdown, and exposed
    communication per axis as ``exposed <axis>``."""
    breakdown = scored.prediction.breakdown
    terms = {
        key.removesuffix("_s"): float(value)
        for key, value in breakdown.items()
        if key.endswith("_s") and isinstance(value, (int, float))
    }
    for axis, seconds in breakdown.get("exposed_comm_s", {}).items():
        terms[f"exposed {axis} comm"] = float(seconds)
    return terms


def layer_comm_bytes(model: ModelSpec, scored: Scored) -> dict[str, float]:
    """Bytes per device each mesh axis moves for one layer and micro-batch (forward and
    backward, activations only), from the SBP layout of the model's first layer kind."""
    part = "moe" if model.moe is not None and model.num_moe_layers else "dense"
    try:
        layout = part_layout(model, scored.strategy, part)
    except LayoutError:
        return {}
    per_axis: dict[str, float] = defaultdict(float)
    for c in forward_collectives(layout) + backward_collectives(layout):
        per_axis[c.axis] += c.bytes
    return dict(per_axis)


def explain(model: ModelSpec, scored: Scored) -> dict[str, Any]:
    """One plan as a JSON-ready dict: strategy, figures and where the time goes."""
    p = scored.prediction
    breakdown = p.breakdown
    return {
        "strategy": scored.strategy.to_string(),
        "step_time_s": p.step_time_s,
        "tokens_per_s": p.tokens_per_s,
        "mfu": p.mfu,
        "memory_gib": p.memory_gib,
        "fits": p.fits,
        "compute_s": breakdown.get("compute_s"),
        "bubble_s": breakdown.get("bubble_s"),
        "exposed_comm_s": breakdown.get("exposed_comm_s", {}),
        "memory_by_term_gib": breakdown.get("memory_gib", {}),
        "layer_comm_bytes": layer_comm_bytes(model, scored),
        "techniques": techniques(scored),
    }


def techniques(scored: Scored) -> list[str]:
    """One line per device technique the plan uses, with its effect."""
    s, breakdown = scored.strategy, scored.prediction.breakdown
    lines = []
    moe = breakdown.get("moe_overlap")
    if s.moe_overlap != "none":
        text = f"MoE all-to-alls overlapped with {s.moe_overlap} ({s.moe_chunks} chunks"
        groups = f" x {s.moe_groups} column group{'s' * (s.moe_groups > 1)}"
        text += f"{groups})" if s.moe_overlap == "comet" else ")"
        if moe:
            text += (
                f": {moe['hidden_fraction']:.0%} of the EP traffic hidden, "
                f"{moe['plain_layer_s'] / moe['layer_s']:.2f}x per MoE layer over plain"
            )
        lines.append(text)
    elif moe:
        lines.append("MoE all-to-alls not overlapped: plain is the fastest schedule here")
    if s.swap:
        swap = breakdown.get("swap", {})
        exposed = breakdown.get("exposed_comm_s", {}).get("host", 0.0)
        lines.append(
            f"activation swap: {swap.get('host_gib', 0.0):.1f} GiB per device in host "
            f"memory, {exposed:.3g} s per step of host copies not hidden by compute"
        )
    if s.memory_cap:
        default = default_memory_cap(s.pp, s.vpp, s.slices)
        lines.append(
            f"SVPP memory cap: {s.memory_cap} slice units in flight per device (default "
            f"{default}): less activation memory, {breakdown.get('bubble_s', 0.0):.3g} s bubble"
        )
    if s.loss_chunk:
        lines.append(f"chunked loss: LM head and loss over {s.loss_chunk} tokens at a time")
    if s.dtype == "fp8":
        lines.append("tile-wise FP8 block linears (attention, router and LM head in bf16)")
    return lines


def runner_up_gap(best: Scored, runner_up: Scored) -> str:
    """Why ``runner_up`` ranks below ``best``: the term that grew the most (and the one
    that shrank the most, when something did)."""
    a, b = best.prediction, runner_up.prediction
    name = f"#2 ({runner_up.strategy.to_string()})"
    if abs(b.step_time_s - a.step_time_s) <= 1e-9 * a.step_time_s:
        if abs(b.memory_gib - a.memory_gib) <= 1e-6:
            return f"{name} ties with #1 (same predicted step time and memory)"
        gib = f"{b.memory_gib:.2f} vs {a.memory_gib:.2f} GiB"
        return f"{name} is as fast but needs more memory ({gib})"
    slower = 100 * (b.step_time_s / a.step_time_s - 1)
    times = f"{b.step_time_s:.4g} s vs {a.step_time_s:.4g} s"
    head = f"{name} is {slower:.2f}% slower per step ({times})"
    ours, theirs = time_terms(best), time_terms(runner_up)
    diffs = {k: theirs.get(k, 0.0) - ours.get(k, 0.0) for k in sorted(set(ours) | set(theirs))}
    grew = max(diffs, key=diffs.get, default=None)
    if grew is None or diffs[grew] <= 0:
        return head
    text = f"{head}: mostly {grew} (+{diffs[grew]:.4g} s)"
    shrank = min(diffs, key=diffs.get)
    if diffs[shrank] < 0:
        text += f", partly offset by {shrank} ({diffs[shrank]:.4g} s)"
    return text


def no_fit_reason(model: ModelSpec, devices: int, device_gib: float, scored: list[Scored]) -> str:
    """One line on why no candidate fits: the leanest one and its largest memory term."""
    where = f"{model.name} does not fit on {devices} devices of {device_gib:g} GiB"
    if not scored:
        return f"{where}: no candidate was scored"
    lean = min(scored, key=lambda s: s.prediction.memory_gib)
    terms = lean.prediction.breakdown.get("memory_gib", {})
    parts = ", ".join(f"{k} {v:.1f}" for k, v in sorted(terms.items(), key=lambda kv: -kv[1]))
    largest = max(terms, key=terms.get) if terms else "?"
    return (
        f"{where}: the leanest plan ({lean.strategy.to_string()}) needs "
        f"{lean.prediction.memory_gib:.1f} GiB per device; largest term: {largest} "
        f"(GiB by term: {parts})"
    )
