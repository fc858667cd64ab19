"""Deterministic weight initialisation, identical for eager, meta-device and sharded builds.

Every random tensor is drawn in float32 on the CPU from one generator seeded by ``seed``,
parameter by parameter in module order, and then copied to the parameter's device and
dtype. So the same seed gives the same weights on any device, in any dtype, and when the
parameters are already DTensors (FSDP2 ``fully_shard`` on a meta-device model, then
``to_empty``): each rank draws the full tensor and keeps its own shard.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from legato.models.norms import NORM_TYPES

INIT_STD = 0.02
# Residual-branch output projections get std / sqrt(2 * num_layers) (GPT-2).
_OUTPUT_PROJECTION_SUFFIXES = ("o_proj.weight", "down_proj.weight", "experts.down_proj")

try:
    from torch.distributed.tensor import DTensor, distribute_tensor
except ImportError:  # pragma: no cover - torch built without distributed
    DTensor = None


def _assign(param: Tensor, full: Tensor) -> None:
    if DTensor is not None and isinstance(param, DTensor):
        full = full.to(device=param.device, dtype=param.dtype)
        # src_data_rank=None: every rank holds the same full tensor, so split locally.
        local = distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None)
        param.to_local().copy_(local.to_local())
    else:
        param.copy_(full)


@torch.no_grad()
def init_weights(model: nn.Module, seed: int, num_layers: int) -> None:
    """Normal(0, 0.02) weights, scaled output projections, unit norms, zero biases; then
    every module's ``reset_buffers`` (RoPE tables, router bias) is called."""
    generator = torch.Generator().manual_seed(seed)
    output_std = INIT_STD / math.sqrt(2 * num_layers)
    for module_name, module in model.named_modules():
        for name, param in module.named_parameters(recurse=False):
            full_name = f"{module_name}.{name}" if module_name else name
            if isinstance(module, NORM_TYPES):
                full = torch.ones(param.shape) if name == "weight" else torch.zeros(param.shape)
            elif name == "bias" or name.endswith("_bias"):
                full = torch.zeros(param.shape)
            else:
                std = output_std if full_name.endswith(_OUTPUT_PROJECTION_SUFFIXES) else INIT_STD
                full = torch.empty(param.shape).normal_(0.0, std, generator=generator)
            _assign(param, full)
        if hasattr(module, "reset_buffers"):
            module.reset_buffers()
