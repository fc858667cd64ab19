"""Measure one training process's memory, kernel and attention rates, and the GEMM
shapes to time (``calibrate.matmul``; ``cost.gemm_fit`` fits them).

These are the numbers ``cost.compute.DeviceModel`` needs, measured the way a training
process sees them: with the thread count it trains with, and (under ``legato calibrate
--nproc N``) while the other processes measure at the same time, so shared cores, caches
and memory bandwidth are counted. Every figure is the median of a few repeats
(``calibrate.timing``).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from legato.calibrate.timing import seconds_per_call


def measure_copy_bandwidth(nbytes: int, budget_s: float, repeats: int = 5) -> float:
    """Bytes/s of a large tensor copy (each byte read once and written once)."""
    src = torch.ones(nbytes // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    (seconds,) = seconds_per_call([lambda: dst.copy_(src)], budget_s, repeats)
    return 2 * nbytes / seconds


def measure_elementwise_bandwidth(nbytes: int, budget_s: float, repeats: int = 5) -> float:
    """Bytes/s that eager elementwise kernels stream on tensors of ``nbytes`` (beyond the
    caches): the median over a product, a sigmoid and a softmax (the kinds of kernels of
    norms, activations and the loss), each counted as reading its inputs and writing its
    output once."""
    x = torch.randn(nbytes // 4 // 1024, 1024)
    y, out = torch.randn_like(x), torch.empty_like(x)
    ops = (
        (lambda: torch.mul(x, y, out=out), 3),
        (lambda: torch.sigmoid(x, out=out), 2),
        (lambda: torch.softmax(x, dim=-1, out=out), 2),
    )
    seconds = seconds_per_call([fn for fn, _ in ops], budget_s, repeats)
    return statistics.median(p * nbytes / t for (_, p), t in zip(ops, seconds, strict=True))


# PyTorch spreads an elementwise kernel over its threads when it has more than this many
# elements (at::internal::GRAIN_SIZE); smaller kernels run on the calling thread.
GRAIN_SIZE = 32768


def measure_parallel_overhead(budget_s: float, repeats: int = 5) -> float:
    """Seconds a kernel just big enough to be multi-threaded pays for it: a product of
    ``2 x GRAIN_SIZE`` elements (cache-resident) with this process's threads minus the same
    on one thread. The fork/join of the parallel region costs microseconds on idle cores and
    milliseconds on an oversubscribed host, where it waits for a descheduled thread; eager
    training runs hundreds of such kernels per micro-batch. 0 with one thread."""
    threads = torch.get_num_threads()
    if threads == 1:
        return 0.0
    n = 2 * GRAIN_SIZE
    x, y, out = torch.randn(n), torch.randn(n), torch.empty(n)

    def on(n: int) -> Callable[[], None]:
        def run() -> None:
            torch.set_num_threads(n)
            torch.mul(x, y, out=out)

        return run

    try:
        parallel, single = seconds_per_call([on(threads), on(1)], budget_s, repeats)
    finally:
        torch.set_num_threads(threads)
    return max(0.0, parallel - single)


def attention_flops(batch_heads: int, seq: int, head_dim: int) -> float:
    """Forward FLOPs of causal attention as the cost model counts them (``cost.layer``):
    ``QK^T`` and ``AV`` over the ``s (s + 1) / 2`` unmasked pairs."""
    return 2.0 * batch_heads * seq * (seq + 1) / 2 * 2 * head_dim


# (batch, heads, sequence, head dim): common head widths at a short sequence.
ATTENTION_SHAPES: tuple[tuple[int, int, int, int], ...] = (
    (2, 4, 512, 32),
    (2, 4, 512, 64),
    (2, 4, 512, 128),
)


def measure_attention_rate(
    shapes: Sequence[tuple[int, int, int, int]], budget_s: float, repeats: int = 5
) -> float:
    """FLOP/s of fused causal attention (``scaled_dot_product_attention``), forward plus
    backward, counted as the cost model counts it (the backward is 2.5 forwards, so
    ``3.5 x attention_flops / seconds``); the median over ``shapes``."""

    def step_of(batch: int, heads: int, seq: int, dim: int) -> Callable[[], None]:
        q, k, v = (torch.randn(batch, heads, seq, dim, requires_grad=True) for _ in range(3))
        grad = torch.randn(batch, heads, seq, dim)

        def step() -> None:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            q.grad = k.grad = v.grad = None
            out.backward(grad)

        return step

    seconds = seconds_per_call([step_of(*shape) for shape in shapes], budget_s, repeats)
    return statistics.median(
        3.5 * attention_flops(b * h, s, d) / t
        for (b, h, s, d), t in zip(shapes, seconds, strict=True)
    )
