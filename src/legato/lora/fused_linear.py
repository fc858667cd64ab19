"""The fused multi-task LoRA linear layer: one frozen GEMM for all tasks, one segmented
GEMM per LoRA factor, in a single autograd function written for this purpose.

This is the seed idea of LOTUS (operator enlargement). Unfused, ``k`` tasks run ``k``
small base GEMMs per layer plus ``2k`` tiny LoRA GEMMs, each in its own autograd graph.
Fused, the tokens of all tasks are packed along rows (no padding between tasks), the
frozen weight sees them in one GEMM, and each task's ``A`` and ``B`` run as a segmented
GEMM over the task's rows (``segmented``)::

    y              = x W^T + b                          (all tasks, one GEMM)
    h[seg i]       = x_lora[seg i] A_i^T * scale_i      (segmented shrink, rank r_i)
    y[seg i]      += h[seg i] B_i^T                     (segmented expand)

The backward is written by hand so that it, too, is one GEMM for the input gradient plus
segmented GEMMs for every adapter's ``dA_i``/``dB_i`` and the LoRA part of ``dx``, all
from one autograd node; the frozen ``W`` and ``b`` get no gradient and are saved only for
``dx = dy W``. ``x_lora`` is the input after each task's LoRA dropout (the same tensor as
``x`` when no task drops).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from legato.lora.segmented import Backend, Segment, lora_backward, lora_forward, pick_backend

__all__ = ["FusedLoraLinearFunction", "Segment", "fused_lora_linear"]


class FusedLoraLinearFunction(torch.autograd.Function):
    """``apply(x, x_lora, weight, bias, segments, backend, A_0, B_0, A_1, B_1, ...)``."""

    @staticmethod
    def forward(ctx, x, x_lora, weight, bias, segments, backend, *factors):
        a_mats, b_mats = factors[0::2], factors[1::2]
        y = F.linear(x, weight, bias)
        saved = lora_forward(x_lora, y, segments, a_mats, b_mats, backend)
        ctx.segments, ctx.backend, ctx.num_saved = segments, backend, len(saved)
        ctx.same_input = x_lora is x
        ctx.save_for_backward(x_lora, weight, *saved, *factors)
        return y

    @staticmethod
    def backward(ctx, grad_y):
        x_lora, weight, *rest = ctx.saved_tensors
        saved, factors = rest[: ctx.num_saved], rest[ctx.num_saved :]
        grad_x = grad_x_lora = None
        if ctx.needs_input_grad[0]:
            grad_x = grad_y @ weight
        if ctx.needs_input_grad[1] and not ctx.same_input:
            grad_x_lora = torch.zeros_like(x_lora)
        grads_a, grads_b = lora_backward(
            grad_y,
            x_lora,
            saved,
            ctx.segments,
            factors[0::2],
            factors[1::2],
            grad_x if ctx.same_input else grad_x_lora,
            ctx.backend,
        )
        factor_grads = [t for pair in zip(grads_a, grads_b, strict=True) for t in pair]
        return (grad_x, grad_x_lora, None, None, None, None, *factor_grads)


def fused_lora_linear(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    segments: Sequence[Segment],
    factors: Sequence[tuple[Tensor, Tensor]],
    *,
    x_lora: Tensor | None = None,
    backend: Backend = "auto",
) -> Tensor:
    """``x`` [T, in] through a frozen ``weight`` [out, in] plus, on each segment's rows, that
    segment's LoRA ``(A [r, in], B [out, r])``. Segments must be sorted and disjoint; rows
    outside every segment get the base output only. Factors are cast to ``x``'s dtype
    (fp32 master weights with a bf16 backbone; autograd casts their gradients back)."""
    if not segments:
        return F.linear(x, weight, bias)
    flat = [f.to(x.dtype) for pair in factors for f in pair]
    x_lora = x if x_lora is None else x_lora
    return FusedLoraLinearFunction.apply(
        x, x_lora, weight, bias, tuple(segments), pick_backend(x, backend), *flat
    )
