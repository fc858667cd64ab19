"""Routed experts as stacked weights, computed with grouped GEMMs on expert-sorted rows.

Parameters keep the reference model's names and shapes: ``gate_proj``/``up_proj``
[E, ffn, h] (no ``gate_proj`` for non-gated experts), ``down_proj`` [E, h, ffn], and with
``bias`` also ``{name}_bias``. Under expert parallelism they are DTensors sharded on dim 0
over the EP mesh and each rank computes with its local slice (:meth:`local_weights`).

The computation is split in two so the overlap schedules can interleave communication:
:meth:`hidden` (first GEMMs and the activation) and :meth:`down` (the second GEMM,
optionally for a slice of output columns only, Comet's "layer 1" decomposition).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields

import torch
from torch import Tensor, nn

from legato.moe.grouped_gemm import GemmImpl, grouped_mm

Activation = Callable[[Tensor, Tensor | None], Tensor]  # (up, gate or None) -> hidden


@dataclass
class ExpertWeights:
    """One forward's local expert weights, in the compute dtype (``None``: absent)."""

    gate_proj: Tensor | None
    up_proj: Tensor
    down_proj: Tensor
    gate_proj_bias: Tensor | None
    up_proj_bias: Tensor | None
    down_proj_bias: Tensor | None


@dataclass
class Groups:
    """Rows of a buffer grouped by local expert: ``sizes[g]`` rows for expert g, and the
    expert of every row (for the biases)."""

    sizes: list[int]
    row_expert: Tensor


class _ScaleGrad(torch.autograd.Function):
    """Identity forward; backward multiplies the gradient by ``scale``."""

    @staticmethod
    def forward(ctx, x: Tensor, scale: float) -> Tensor:
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        return grad * ctx.scale, None


def make_groups(sizes: list[int], device: torch.device) -> Groups:
    ids = torch.arange(len(sizes), device=device)
    counts = torch.tensor(sizes, device=device)
    return Groups(sizes, ids.repeat_interleave(counts, output_size=sum(sizes)))


class GroupedExperts(nn.Module):
    """E expert MLPs (``activation(up, gate)`` then ``down``) as stacked parameters."""

    def __init__(
        self,
        num_experts: int,
        hidden: int,
        ffn: int,
        *,
        gated: bool,
        bias: bool,
        activation: Activation,
    ) -> None:
        super().__init__()
        self.activation = activation
        self.gemm_impl: GemmImpl = "auto"
        self.grad_scale = 1.0  # expert parallelism: 1/(dp*cp), see apply_expert_parallel
        shapes = {"up_proj": (ffn, hidden), "down_proj": (hidden, ffn)}
        if gated:
            shapes = {"gate_proj": (ffn, hidden), **shapes}
        for name in ("gate_proj", "up_proj", "down_proj"):
            shape = shapes.get(name)
            weight = None if shape is None else nn.Parameter(torch.empty(num_experts, *shape))
            self.register_parameter(name, weight)
            has_bias = bias and shape is not None
            bias_param = nn.Parameter(torch.empty(num_experts, shape[0])) if has_bias else None
            self.register_parameter(f"{name}_bias", bias_param)

    def local_weights(self, dtype: torch.dtype) -> ExpertWeights:
        """This rank's experts (the local shard of DTensor parameters), cast to ``dtype``,
        their gradients scaled by ``grad_scale``."""

        def local(name: str) -> Tensor | None:
            param = getattr(self, name)
            if param is None:
                return None
            param = param.to_local() if hasattr(param, "to_local") else param
            if self.grad_scale != 1.0:
                param = _ScaleGrad.apply(param, self.grad_scale)
            return param.to(dtype)

        return ExpertWeights(**{f.name: local(f.name) for f in fields(ExpertWeights)})

    def _project(self, x: Tensor, weight: Tensor, bias: Tensor | None, groups: Groups) -> Tensor:
        y = grouped_mm(x, weight, groups.sizes, self.gemm_impl)
        return y if bias is None else y + bias.index_select(0, groups.row_expert)

    def hidden(self, x: Tensor, groups: Groups, w: ExpertWeights) -> Tensor:
        """``activation(up(x), gate(x))`` for expert-grouped rows ``x`` [n, h] -> [n, ffn]."""
        up = self._project(x, w.up_proj, w.up_proj_bias, groups)
        gate = None
        if w.gate_proj is not None:
            gate = self._project(x, w.gate_proj, w.gate_proj_bias, groups)
        return self.activation(up, gate)

    def down(
        self, h: Tensor, groups: Groups, w: ExpertWeights, columns: slice = slice(None)
    ) -> Tensor:
        """Output columns ``columns`` of ``down(h)`` -> [n, len(columns)]."""
        bias = None if w.down_proj_bias is None else w.down_proj_bias[:, columns]
        return self._project(h, w.down_proj[:, columns], bias, groups)
