"""Measure one training process's compute: GEMM rate by shape, memory and attention rates.

These are the numbers ``cost.compute.DeviceModel`` needs, measured the way a training
process sees them: with the thread count it trains with, and (under ``legato calibrate
--nproc N``) while the other processes measure at the same time, so shared cores, caches
and memory bandwidth are counted. Every figure is the median of a few repeats, because
on a shared machine single runs are noise.

The GEMM model is the cost model's: a ``[M, K] x [K, N]`` product runs at ``R / (1 +
d0/M + d0/N + d0/K)``. ``fit_gemm_rate`` recovers the asymptotic rate ``R`` and the
half-efficiency size ``d0`` by linear least squares on the relative error
(``fit_nonnegative``, shared with the link fit), so a small GEMM weighs as much as a
large one.
"""

from __future__ import annotations

import dataclasses
import itertools
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}

# Shapes (M, N, K) spanning the small dimensions of a small model's GEMMs (tokens x hidden,
# hidden x FFN, the vocabulary head) and large squares that show the asymptote.
GEMM_SHAPES: tuple[tuple[int, int, int], ...] = (
    (256, 256, 256),
    (512, 512, 512),
    (1024, 1024, 1024),
    (2048, 1024, 1024),
    (1024, 1024, 64),
    (1024, 64, 1024),
    (64, 1024, 1024),
    (2048, 512, 128),
    (2048, 128, 512),
    (128, 512, 2048),
    (2048, 2048, 128),
)
QUICK_GEMM_SHAPES: tuple[tuple[int, int, int], ...] = (
    (256, 256, 256),
    (512, 512, 512),
    (512, 512, 32),
    (1024, 64, 256),
)


@dataclass(frozen=True)
class GemmTiming:
    """Median seconds of one ``[m, k] x [k, n]`` product in ``dtype``."""

    m: int
    n: int
    k: int
    dtype: str
    seconds: float

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k

    @property
    def rate(self) -> float:
        return self.flops / self.seconds


@dataclass(frozen=True)
class GemmFit:
    """``rate(M, N, K) = peak_flops / (1 + half_dim (1/M + 1/N + 1/K))``; ``error`` is the
    mean relative error of the fit over the measured shapes."""

    peak_flops: float
    half_dim: float
    error: float

    def rate(self, m: float, n: float, k: float) -> float:
        return self.peak_flops / (1.0 + self.half_dim * (1 / m + 1 / n + 1 / k))


def calls_per_trial(
    fn: Callable[[], object],
    share_s: float,
    agree: Callable[[float], float] = lambda seconds: seconds,
) -> int:
    """Calls of ``fn`` that take about ``share_s``: double the count until a batch takes
    a tenth of it (one fast call is a poor estimate on a loaded host, where most calls
    wait for a core), then scale. The batches double as warm-up. ``agree`` maps this
    process's batch time to the one to go by (for a collective: the slowest rank's)."""
    fn()
    calls = 1
    while True:
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        elapsed = agree(time.perf_counter() - start)
        if elapsed >= share_s / 10 or calls >= 1 << 20:
            return max(1, round(calls * share_s / max(elapsed, 1e-9)))
        calls *= 2


def median_seconds(
    fns: Sequence[Callable[[], object]], budget_s: float, repeats: int = 5
) -> list[float]:
    """Median over ``repeats`` trials of the seconds per call of each of ``fns``.

    The trials are interleaved (one of each function per round), so a burst of load from
    other processes on a shared machine lands on every function alike instead of on
    whichever was being timed; each trial runs as many calls as fit in its share of
    ``budget_s`` (at least one).
    """
    share = budget_s / repeats / len(fns)
    calls = [calls_per_trial(fn, share) for fn in fns]
    trials: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, n, out in zip(fns, calls, trials, strict=True):
            start = time.perf_counter()
            for _ in range(n):
                fn()
            out.append((time.perf_counter() - start) / n)
    return [statistics.median(t) for t in trials]


# Bytes of operands each GEMM shape cycles through: beyond the per-core caches, so each
# product reads its operands from memory as a training step's GEMMs do (a product of
# cache-hot operands measured 15-30% faster here than the same product of cold ones).
COLD_BYTES = 64 << 20


def _cold_gemm(
    pool: torch.Tensor, m: int, n: int, k: int, dtype: torch.dtype
) -> Callable[[], object]:
    """One call multiplies the next ``[m, k] x [k, n]`` pair of views into ``pool``."""
    size = m * k + k * n
    if size * 2 > pool.numel():  # too big to cycle in the pool: two pairs of their own
        pool = torch.randn(size * 2, dtype=dtype)
    pairs = [
        (pool[i : i + m * k].view(m, k), pool[i + m * k : i + size].view(k, n))
        for i in range(0, pool.numel() - size + 1, size)
    ]
    out = torch.empty(m, n, dtype=dtype)
    order = itertools.cycle(pairs)

    def call() -> object:
        a, b = next(order)
        return torch.mm(a, b, out=out)

    return call


def measure_gemms(
    shapes: Sequence[tuple[int, int, int]],
    dtype: str,
    budget_s: float,
    repeats: int = 5,
    cold_bytes: int = COLD_BYTES,
) -> list[GemmTiming]:
    """Median seconds of each shape with operands cycling through ``cold_bytes``, in
    about ``budget_s`` seconds in all."""
    torch_dtype = DTYPES[dtype]
    pool = torch.randn(cold_bytes // torch_dtype.itemsize, dtype=torch_dtype)
    fns = [_cold_gemm(pool, m, n, k, torch_dtype) for m, n, k in shapes]
    seconds = median_seconds(fns, budget_s, repeats)
    return [GemmTiming(m, n, k, dtype, t) for (m, n, k), t in zip(shapes, seconds, strict=True)]


def fit_nonnegative(rows: Sequence[Sequence[float]], seconds: Sequence[float]) -> list[float]:
    """Coefficients ``c >= 0`` of ``seconds ~ rows @ c`` minimising the squared relative
    error; a coefficient the data want negative is held at 0 and the rest refitted."""
    x = np.asarray(rows, dtype=float) / np.asarray(seconds, dtype=float)[:, None]
    free = list(range(x.shape[1]))
    while True:
        coef, *_ = np.linalg.lstsq(x[:, free], np.ones(len(x)), rcond=None)
        if not free or coef.min() >= 0:
            out = [0.0] * x.shape[1]
            for i, c in zip(free, coef, strict=True):
                out[i] = float(c)
            return out
        free.pop(int(np.argmin(coef)))


def _mean_error(predicted: Sequence[float], measured: Sequence[float]) -> float:
    return statistics.fmean(abs(p / m - 1) for p, m in zip(predicted, measured, strict=True))


# The largest plausible half-efficiency size (twice the GPUs' fitted 32). With it, the
# law caps the asymptote at ``best rate x (1 + MAX_HALF_DIM x s)`` of the largest shape
# measured: a fit beyond that extrapolates noise (under interference small GEMMs slow
# down most, and a free fit then answers with an asymptote no shape comes near).
MAX_HALF_DIM = 64.0


def fit_gemm_rate(timings: Sequence[GemmTiming]) -> GemmFit:
    """Fit ``seconds / flop = (1 + d0 s) / R`` with ``s = 1/M + 1/N + 1/K``: linear in
    ``(1/R, d0/R)``; ``R`` is capped as ``MAX_HALF_DIM`` says and ``d0`` refitted."""
    s = [1 / t.m + 1 / t.n + 1 / t.k for t in timings]
    y = [t.seconds / t.flops for t in timings]
    inv_peak, slope = fit_nonnegative([(1.0, x) for x in s], y)
    best = max(timings, key=lambda t: t.rate)
    cap = best.rate * (1 + MAX_HALF_DIM * (1 / best.m + 1 / best.n + 1 / best.k))
    if inv_peak * cap < 1:  # 1/R < 1/cap: refit d0 with R = cap, same relative error
        inv_peak = 1 / cap
        a = [x * inv_peak / yi for x, yi in zip(s, y, strict=True)]
        b = [1 - inv_peak / yi for yi in y]
        slope = (
            max(0.0, sum(ai * bi for ai, bi in zip(a, b, strict=True)) / sum(ai * ai for ai in a))
            * inv_peak
        )
    fit = GemmFit(1 / inv_peak, slope / inv_peak, 0.0)
    error = _mean_error([fit.rate(t.m, t.n, t.k) for t in timings], [t.rate for t in timings])
    return dataclasses.replace(fit, error=error)


def measure_copy_bandwidth(nbytes: int, budget_s: float, repeats: int = 5) -> float:
    """Bytes/s of a large tensor copy (each byte read once and written once)."""
    src = torch.ones(nbytes // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    (seconds,) = median_seconds([lambda: dst.copy_(src)], budget_s, repeats)
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
    seconds = median_seconds([fn for fn, _ in ops], budget_s, repeats)
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
        parallel, single = median_seconds([on(threads), on(1)], budget_s, repeats)
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

    seconds = median_seconds([step_of(*shape) for shape in shapes], budget_s, repeats)
    return statistics.median(
        3.5 * attention_flops(b * h, s, d) / t
        for (b, h, s, d), t in zip(shapes, seconds, strict=True)
    )
