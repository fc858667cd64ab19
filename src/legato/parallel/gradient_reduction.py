"""Gradients a step reduces itself after its backward, where no DDP or FSDP2 hook does.

Three cases, one mechanism (a flat all-reduce of each rank's local gradient tensors):

* parameters whose gradient each rank of a group takes from its own tokens only: MoE
  routers over tp when ep folds over it, experts over the ``edp`` ranks that hold them;
* ZeRO-0 beside layouts DDP cannot wrap (tensor-parallel DTensors, experts left to EP, a
  chunked loss that calls ``hidden_states`` rather than ``forward``): the gradients are
  averaged over the data-parallel ranks once per step, after the last micro-batch
  (Megatron's non-overlapped gradient all-reduce; DDP would overlap it with backward);
* a pipeline stage without ZeRO, whose runner takes gradients with ``autograd.grad``.

A DTensor gradient is reduced by its local shard: the ranks of the group hold the same
shard index (tp and dp peers of one layout). A rank without a gradient sends zeros, so
every rank of a group sends the same layout.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from legato.parallel.process_group import all_reduce_flat


@dataclass(frozen=True)
class GradientReduction:
    """``params``' gradients summed over ``group``, then divided by ``divisor`` (the number
    of data-parallel ranks for a mean, 1 for a sum)."""

    params: Sequence[nn.Parameter]
    group: dist.ProcessGroup
    divisor: int = 1

    @torch.no_grad()
    def run(self) -> None:
        grads = local_gradients(self.params)
        all_reduce_flat(grads, self.group).wait()
        if self.divisor > 1:
            torch._foreach_div_(grads, self.divisor)


def local_gradients(params: Sequence[nn.Parameter]) -> list[torch.Tensor]:
    """Each parameter's gradient as this rank holds it (zeros where it has none)."""
    grads = []
    for param in params:
        if param.grad is None:
            param.grad = torch.zeros_like(param)
        grad = param.grad
        grads.append(grad.to_local() if isinstance(grad, DTensor) else grad)
    return grads
