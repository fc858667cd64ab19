"""Split backward: B computes input gradients, W the linear layers' weight gradients later.

Zero Bubble (and MEPipe's fine-grained W) defer the weight-gradient GEMMs of the linear
layers, dW = dY^T X, off the critical path. While a forward runs inside
:class:`DeferLinearWeightGrads` every ``F.linear`` whose weight is a leaf parameter goes
through :class:`_DeferredLinear`: its backward returns only dX = dY W and leaves a
:class:`LinearGrad` record (X, dY, weight, bias) behind. The autograd graph of the pass
can then be freed right after B; what W needs is exactly the records' X and dY.
:func:`weight_grad_groups` cuts a unit's records into G contiguous groups of about equal
GEMM work (the IR's W subtasks) and :func:`apply_weight_grads` runs one group.

Parameters that are not linear weights (norms, embeddings, stacked MoE experts) are cheap
elementwise or gather reductions; B computes them with the input gradient, as Zero
Bubble's implementation does. ``F.linear`` calls on non-leaf weights (a cast or a view of
a stacked parameter) are left to autograd for the same reason.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.overrides import TorchFunctionMode


@dataclass
class LinearGrad:
    """What the weight gradient of one ``F.linear`` call needs: its input and, after B,
    the gradient of its output. ``x`` (and later ``dy``) may be wrapped by ``hold``."""

    x: Any
    weight: Tensor
    bias: Tensor | None
    dy: Any = None

    @property
    def flops(self) -> int:
        return 2 * self.weight.numel() * (_unwrap(self.x).numel() // self.weight.shape[1])


def _unwrap(t: Any) -> Tensor:
    return t if isinstance(t, Tensor) or t is None else t.tensor


class _DeferredLinear(torch.autograd.Function):
    """``F.linear`` whose backward gives dX only and records dY for the deferred W."""

    @staticmethod
    def forward(
        ctx: Any, x: Tensor, weight: Tensor, bias: Tensor | None, record: LinearGrad, hold: Any
    ) -> Tensor:
        ctx.record, ctx.hold = record, hold
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx: Any, dy: Tensor) -> tuple[Tensor | None, None, None, None, None]:
        record, ctx.record = ctx.record, None
        record.dy = ctx.hold(dy)
        dx = dy.matmul(record.weight) if ctx.needs_input_grad[0] else None
        return dx, None, None, None, None


class DeferLinearWeightGrads(TorchFunctionMode):
    """Within the block, linear layers on leaf parameters defer their weight gradients.

    ``records`` collects one :class:`LinearGrad` per call, in call order. ``hold`` wraps the
    tensors records keep (e.g. an activation meter's handle); identity by default.
    """

    def __init__(self, hold: Callable[[Tensor], Any] | None = None) -> None:
        super().__init__()
        self.records: list[LinearGrad] = []
        self.hold = hold or (lambda t: t)

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if func is F.linear and torch.is_grad_enabled():  # no graph (a custom Function's
            # forward, e.g. the chunked loss's): its own backward computes the weight grad
            named = dict(zip(("input", "weight", "bias"), args, strict=False)) | kwargs
            x, weight, bias = named["input"], named["weight"], named.get("bias")
            if _deferrable(weight) and (bias is None or _deferrable(bias)):
                # detached: a record must not keep the graph (and through it itself) alive
                record = LinearGrad(self.hold(x.detach()), weight, bias)
                self.records.append(record)
                return _DeferredLinear.apply(x, weight, bias, record, self.hold)
        return func(*args, **kwargs)


def _deferrable(param: Tensor) -> bool:
    return param.is_leaf and param.requires_grad


def deferred_params(records: Sequence[LinearGrad]) -> set[int]:
    """ids of the parameters whose gradients the records (W) compute."""
    out = {id(r.weight) for r in records}
    return out | {id(r.bias) for r in records if r.bias is not None}


def weight_grad_groups(records: Sequence[LinearGrad], groups: int) -> list[list[LinearGrad]]:
    """Cut the records, in order, into ``groups`` contiguous groups of about equal FLOPs
    (a group may be empty when there are fewer records than groups)."""
    flops = [r.flops for r in records]
    total = sum(flops) or 1
    out: list[list[LinearGrad]] = [[] for _ in range(groups)]
    done = 0
    for r, f in zip(records, flops, strict=True):
        out[min(groups - 1, int(groups * (done + f / 2) / total))].append(r)
        done += f
    return out


def apply_weight_grads(records: Sequence[LinearGrad]) -> None:
    """dW = dY^T X (and db = sum dY) for each record, added to the parameters' ``.grad``."""
    for r in records:
        if r.dy is None:  # the output did not reach the loss: zero gradient
            continue
        dy, x = _unwrap(r.dy), _unwrap(r.x)
        dy2 = dy.reshape(-1, dy.shape[-1])
        _accumulate(r.weight, dy2.t().mm(x.reshape(-1, x.shape[-1])))
        if r.bias is not None:
            _accumulate(r.bias, dy2.sum(0))


def _accumulate(param: Tensor, grad: Tensor) -> None:
    grad = grad.to(param.dtype)
    if param.grad is None:
        param.grad = grad
    else:
        param.grad += grad
