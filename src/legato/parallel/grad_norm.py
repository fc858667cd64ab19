"""The global gradient norm over parameters that live on several meshes.

Tensor- and expert-parallel DTensors sit beside FSDP2's, and a pipeline rank holds only
its stages: torch's ``clip_grad_norm_`` computes one ``foreach`` norm and refuses a mix of
meshes. Here each mesh's squared norm is made whole on its own and the squares are added,
so a step (``data_parallel_step``, ``pipeline_step``) can also add other ranks' squares
(over ``pp``) before clipping with the one total.
"""

from __future__ import annotations

from collections import defaultdict

import torch
from torch import Tensor, nn
from torch.distributed.tensor import DTensor


def _by_mesh(params: list[nn.Parameter]) -> list[list[nn.Parameter]]:
    groups: dict[object, list[nn.Parameter]] = defaultdict(list)
    for p in params:
        if p.grad is not None:
            groups[p.grad.device_mesh if isinstance(p.grad, DTensor) else None].append(p)
    return list(groups.values())


def squared_grad_norm(params: list[nn.Parameter], device: torch.device) -> Tensor:
    """The sum of the squared gradients of ``params`` (whole tensors, shards gathered)."""
    squares = []
    for group in _by_mesh(params):
        norm = torch.nn.utils.get_total_norm([p.grad for p in group], foreach=True)
        squares.append((norm.full_tensor() if isinstance(norm, DTensor) else norm).square())
    return torch.stack(squares).sum() if squares else torch.zeros((), device=device)


def clip_to_norm(params: list[nn.Parameter], max_norm: float, total: Tensor) -> None:
    """Scale the gradients of ``params`` by ``max_norm / total`` where that is below 1."""
    for group in _by_mesh(params):
        torch.nn.utils.clip_grads_with_norm_(group, max_norm, total, foreach=True)
