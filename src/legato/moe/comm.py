"""Differentiable all-to-all with uneven splits, split into a *start* and a *wait* half.

Ours rather than ``torch.distributed.nn.functional.all_to_all_single``: that one waits
inside forward and inside backward, so nothing can run while the data moves. Here the
forward of :func:`start_all_to_all` only issues the collective (``async_op=True``) and
:func:`wait_all_to_all` blocks until it is done, so compute placed between the two calls
overlaps the transfer. Backward mirrors the pair: the wait's backward *issues* the reverse
all-to-all of the gradient (splits swapped) and the start's backward waits for it, so the
autograd engine runs other backward work while gradients travel.

Every rank must start the same collectives in the same order (true when they run the same
code); each transfer may have any size, including zero rows. On CUDA the collective is
issued from a side stream that first waits for the compute stream, and ``wait`` makes the
compute stream wait for the transfer (the host never blocks); gloo runs collectives on
its own worker threads, so on the CPU ``wait`` blocks the host until the data is there.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

_SIDE_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


@dataclass(frozen=True)
class EPGroup:
    """The expert-parallel process group and this rank's place in it."""

    group: dist.ProcessGroup
    size: int
    rank: int


class Transfer:
    """One all-to-all of a layer and its mirrored backward: splits and the in-flight work."""

    def __init__(self, send_splits: list[int], recv_splits: list[int], group) -> None:
        self.send_splits = send_splits
        self.recv_splits = recv_splits
        self.group = group
        self.work: dist.Work | None = None
        self.grad: Tensor | None = None  # backward's receive buffer
        self.sending: Tensor | None = None  # held until the work is done (see ``issue``)

    def issue(self, x: Tensor, send: list[int], recv: list[int]) -> Tensor:
        out = x.new_empty((sum(recv), *x.shape[1:]))
        x = x.contiguous()
        if not x.is_cuda:
            # gloo reads ``x`` on its own thread after this returns: keep it alive until
            # ``wait``, or the allocator may hand its memory (a temporary, a gradient that
            # autograd frees) to another tensor while it is still being sent
            self.sending = x
            self.work = _all_to_all(out, x, recv, send, self.group)
            return out
        side = _SIDE_STREAMS.setdefault(x.device, torch.cuda.Stream(x.device))
        side.wait_stream(torch.cuda.current_stream(x.device))
        with torch.cuda.stream(side):
            self.work = _all_to_all(out, x, recv, send, self.group)
        x.record_stream(side)
        out.record_stream(side)
        return out

    def wait(self) -> None:
        if self.work is not None:
            self.work.wait()
            self.work = None
        self.sending = None


def _all_to_all(out: Tensor, x: Tensor, recv: list[int], send: list[int], group) -> dist.Work:
    return dist.all_to_all_single(out, x, recv, send, group=group, async_op=True)


class _Start(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, transfer: Transfer) -> Tensor:
        ctx.transfer = transfer
        return transfer.issue(x, transfer.send_splits, transfer.recv_splits)

    @staticmethod
    def backward(ctx, _grad: Tensor) -> tuple[Tensor, None]:
        transfer = ctx.transfer
        transfer.wait()  # the reverse all-to-all issued by _Wait.backward
        grad, transfer.grad = transfer.grad, None
        return grad, None


class _Wait(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y: Tensor, transfer: Transfer) -> Tensor:
        transfer.wait()
        ctx.transfer = transfer
        return y.view_as(y)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        transfer = ctx.transfer
        transfer.grad = transfer.issue(grad, transfer.recv_splits, transfer.send_splits)
        return grad, None  # a placeholder: _Start.backward returns the real gradient


def start_all_to_all(
    x: Tensor, send_splits: list[int], recv_splits: list[int], group
) -> tuple[Tensor, Transfer]:
    """Issue the all-to-all of ``x`` (rows ``send_splits[r]`` to rank r); returns the
    receive buffer (not valid until :func:`wait_all_to_all`) and the transfer handle."""
    transfer = Transfer(send_splits, recv_splits, group)
    return _Start.apply(x, transfer), transfer


def wait_all_to_all(buffer: Tensor, transfer: Transfer) -> Tensor:
    """The received rows, once they have arrived."""
    return _Wait.apply(buffer, transfer)


def exchange_counts(counts: Tensor, group) -> Tensor:
    """Row counts ``[P, ranks, L]`` (P transfers, L experts per rank) sent by this rank ->
    ``[P, ranks, L]`` received from each source rank. Blocking; no gradient."""
    send = counts.transpose(0, 1).contiguous()
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    return recv.transpose(0, 1)


class _SumGradient(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, group) -> Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


def sum_gradient(x: Tensor, group) -> Tensor:
    """``x`` unchanged; its gradient summed over ``group`` in the backward (Megatron's
    ``copy_to_tensor_model_parallel_region``): for a tensor every rank of ``group`` holds
    alike whose uses on each rank see only that rank's share of the work."""
    return _SumGradient.apply(x, group)
