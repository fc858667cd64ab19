"""Dynamic loss scaling for fp16 training (Micikevicius et al., "Mixed Precision Training").

fp16 keeps 5 exponent bits: activation gradients below 2**-24 flush to zero in the
backward. The step multiplies the loss by ``scale`` before the backward, so the small
gradients stay representable, and divides the gradients by it before clipping and the
optimizer (fp32 master weights, as with bf16). A step whose gradients overflowed on any
rank is skipped and the scale halved; after ``growth_interval`` clean steps it doubles
(the schedule of torch's ``GradScaler`` and Megatron's ``DynamicGradScaler``).

Written here rather than using ``torch.amp.GradScaler`` because the skip must be one
decision for every rank: a step's gradients are FSDP2 shards, tensor- and expert-parallel
DTensors and pipeline stages held by different processes, and ``GradScaler`` checks the
tensors of its own process (its sharded variant is FSDP1's). Here the found-overflow flag
is all-reduced over the whole group before any rank steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

INITIAL_SCALE = 2.0**16
GROWTH_INTERVAL = 2000  # clean steps before the scale doubles
MIN_SCALE = 1.0


@dataclass
class LossScaler:
    """The current ``scale`` and the clean steps since it last changed."""

    scale: float = INITIAL_SCALE
    clean_steps: int = 0
    growth_interval: int = GROWTH_INTERVAL

    @torch.no_grad()
    def unscale(self, params: list[nn.Parameter], device: torch.device) -> bool:
        """Divide this rank's gradients by ``scale``; whether every rank's are finite."""
        inverse = 1.0 / self.scale
        overflow = torch.zeros((), device=device)
        for param in params:
            grad = param.grad
            if grad is None:
                continue
            local = grad.to_local() if isinstance(grad, DTensor) else grad
            local.mul_(inverse)
            overflow = torch.maximum(overflow, (~torch.isfinite(local)).any().float())
        if dist.is_initialized():
            dist.all_reduce(overflow, op=dist.ReduceOp.MAX)
        return not bool(overflow.item())

    def update(self, finite: bool) -> None:
        """After a step: halve on overflow (never below 1), double after a clean run."""
        if not finite:
            self.scale, self.clean_steps = max(self.scale / 2, MIN_SCALE), 0
            return
        self.clean_steps += 1
        if self.clean_steps == self.growth_interval:
            self.scale, self.clean_steps = self.scale * 2, 0

    def state_dict(self) -> dict[str, Any]:
        return {"scale": self.scale, "clean_steps": self.clean_steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scale, self.clean_steps = float(state["scale"]), int(state["clean_steps"])
