"""Grouped GEMM over variable-sized row groups: ``y[rows of g] = x[rows of g] @ w[g].T``.

``torch._grouped_mm`` runs all groups in one call. In torch 2.13 it accepts fp32, bf16
and fp16 on the CPU (not fp64), int32 group end offsets, and operands whose strides are
multiples of 16 bytes, in backward too (so input or output rows of 10 fp32 are refused); on CUDA we use it for
bf16 on sm90+ (H100/H200) with 16-byte aligned operands, as its kernels require.
Anything else takes the equivalent loop over groups, which is also the ``impl="loop"``
baseline of the benchmarks; both give the same result.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor
from torch.utils.flop_counter import flop_registry, register_flop_formula

GemmImpl = Literal["auto", "grouped_mm", "loop"]
_CPU_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _aligned(t: Tensor) -> bool:
    strides = (s for s, n in zip(t.stride(), t.shape, strict=True) if s != 1 and n > 1)
    return all(s * t.element_size() % 16 == 0 for s in strides)


def grouped_mm_supported(x: Tensor, weight: Tensor) -> bool:
    """Whether ``torch._grouped_mm`` can multiply ``x`` [n, k] by ``weight`` [G, m, k]^T."""
    if not hasattr(torch, "_grouped_mm") or x.dtype != weight.dtype:
        return False
    rows_bytes = (x.shape[-1] * x.element_size(), weight.shape[-2] * weight.element_size())
    if any(n % 16 for n in rows_bytes) or not _aligned(weight):  # backward needs all three
        return False
    if x.device.type == "cpu":
        return x.dtype in _CPU_DTYPES
    if x.device.type != "cuda" or x.dtype != torch.bfloat16 or weight.data_ptr() % 16:
        return False
    return torch.cuda.get_device_capability(x.device) >= (9, 0)


def _grouped_mm_flops(a_shape, b_shape, *_args, **_kwargs) -> int:
    """FLOPs of ``torch._grouped_mm`` for FlopCounterMode, which has no formula for it in
    torch 2.13: groups partition the rows (2D x 3D), the contraction (2D x 2D, the weight
    gradient), or are a batch (3D x 3D); 3D x 2D partitions the output columns."""
    if len(a_shape) == 2 and len(b_shape) == 3:
        return 2 * a_shape[0] * a_shape[1] * b_shape[2]
    if len(a_shape) == 2:
        return 2 * a_shape[0] * a_shape[1] * b_shape[1]
    if len(b_shape) == 3:
        return 2 * a_shape[0] * a_shape[1] * a_shape[2] * b_shape[2]
    return 2 * a_shape[1] * a_shape[2] * b_shape[1]


if hasattr(torch.ops.aten, "_grouped_mm") and torch.ops.aten._grouped_mm not in flop_registry:
    register_flop_formula(torch.ops.aten._grouped_mm)(_grouped_mm_flops)


class _ContiguousGrad(torch.autograd.Function):
    """Identity whose backward makes the gradient contiguous: ``_grouped_mm``'s backward
    rejects gradients with zero or unaligned strides (e.g. the expanded grad of ``sum``)."""

    @staticmethod
    def forward(ctx, y: Tensor) -> Tensor:
        return y.view_as(y)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        return grad.contiguous()


def grouped_mm(x: Tensor, weight: Tensor, sizes: list[int], impl: GemmImpl = "auto") -> Tensor:
    """``x`` [n, k] (rows grouped, ``sizes[g]`` rows for group g) times ``weight[g]`` [m, k]
    transposed -> [n, m]. Differentiable; empty groups are fine."""
    use_grouped = impl == "grouped_mm" or (impl == "auto" and grouped_mm_supported(x, weight))
    if use_grouped:
        ends = torch.tensor(sizes, dtype=torch.int64).cumsum(0).to(torch.int32)
        y = torch._grouped_mm(
            x.contiguous(), weight.transpose(-2, -1), offs=ends.to(x.device, non_blocking=True)
        )
        return _ContiguousGrad.apply(y)
    parts = [rows @ weight[g].T for g, rows in enumerate(x.split(sizes))]
    return torch.cat(parts) if parts else x.new_empty(0, weight.shape[-2])
