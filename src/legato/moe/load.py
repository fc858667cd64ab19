"""Expert load per optimizer step, and the auxiliary-loss-free bias update that uses it.

Each router counts the slots it routes (``Router.load``). Once per optimizer step the
trainer calls :func:`end_step`: the counts of every MoE layer are summed over the
data-parallel group (so all ranks see, and update their biases from, the same global
load), biases move by the DeepSeek-V3 rule (``Router.update_bias``), and the counts
restart. Recomputing a forward (activation checkpointing) counts its tokens again; the
imbalance measures are ratios and do not change when all counts double.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from legato.moe.layer import moe_layers


@dataclass
class LoadStats:
    """One step's routed slots per expert (``counts[layer][expert]``) and, per layer, the
    max violation ``max_e load_e / mean_e load_e - 1`` (0 when perfectly balanced) and the
    number of experts that received nothing."""

    counts: list[list[int]]
    max_violation: list[float]
    idle_experts: list[int]


def end_step(model: nn.Module, bias_rate: float = 0.0, group=None) -> LoadStats:
    """Collect the step's expert load of every MoE layer in ``model``, update the routers'
    selection biases by ``bias_rate`` (0: leave them), and reset the counts. ``group``:
    the process group to sum the counts over (the data-parallel ranks), or ``None``."""
    routers = [layer.gate for layer in moe_layers(model)]
    if not routers:
        return LoadStats([], [], [])
    load = torch.stack([router.load for router in routers]).double()
    if group is not None and dist.is_initialized():
        dist.all_reduce(load, group=group)
    for router, counts in zip(routers, load, strict=True):
        if bias_rate:
            router.update_bias(counts, bias_rate)
        router.load.zero_()
    mean = load.mean(dim=1)
    violation = torch.where(mean > 0, load.max(dim=1).values / mean.clamp(min=1e-9) - 1, 0.0)
    return LoadStats(
        counts=load.long().tolist(),
        max_violation=violation.tolist(),
        idle_experts=(load == 0).sum(dim=1).tolist(),
    )
