"""The one matrix-multiply probe: GEMM timings for ``legato calibrate``'s rate law and a
device's peak for the trainer's MFU.

A training step's GEMMs read their operands from memory, so calibration cycles each
shape through ``cold_bytes`` of operands (a product of cache-hot operands measured
15-30% faster here than the same product of cold ones) and keeps the median. A peak is
the best case instead: hot operands, the best of a few short trials, which discounts
passing interference.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

import torch

from legato.calibrate.timing import seconds_per_call
from legato.devices.gemm_fit import GemmTiming

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

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

# Bytes of operands each GEMM shape cycles through: beyond the per-core caches.
COLD_BYTES = 64 << 20


def _gemm_call(
    pool: torch.Tensor, m: int, n: int, k: int, dtype: torch.dtype
) -> Callable[[], object]:
    """One call multiplies the next ``[m, k] x [k, n]`` pair of views into ``pool`` (on a
    GPU, and waits for it: the timer must see the kernel, not its launch)."""
    size = m * k + k * n
    if pool.numel() == 0:  # hot operands: one pair, reused
        pool = torch.randn(size, dtype=dtype, device=pool.device)
    elif size * 2 > pool.numel():  # too big to cycle in the pool: two pairs of their own
        pool = torch.randn(size * 2, dtype=dtype, device=pool.device)
    pairs = [
        (pool[i : i + m * k].view(m, k), pool[i + m * k : i + size].view(k, n))
        for i in range(0, pool.numel() - size + 1, size)
    ]
    out = torch.empty(m, n, dtype=dtype, device=pool.device)
    order = itertools.cycle(pairs)
    cuda = pool.device.type == "cuda"

    def call() -> object:
        a, b = next(order)
        result = torch.mm(a, b, out=out)
        if cuda:
            torch.cuda.synchronize(pool.device)
        return result

    return call


def measure_gemms(
    shapes: Sequence[tuple[int, int, int]],
    dtype: str,
    budget_s: float,
    repeats: int = 5,
    cold_bytes: int = COLD_BYTES,
    device: torch.device | None = None,
    statistic: Callable[[list[float]], float] | None = None,
) -> list[GemmTiming]:
    """Seconds of each shape with operands cycling through ``cold_bytes`` (0: one hot
    pair), in about ``budget_s`` seconds in all: the median of ``repeats`` trials, or
    ``statistic`` of them."""
    torch_dtype = DTYPES[dtype]
    pool = torch.randn(cold_bytes // torch_dtype.itemsize, dtype=torch_dtype, device=device)
    fns = [_gemm_call(pool, m, n, k, torch_dtype) for m, n, k in shapes]
    kwargs = {} if statistic is None else {"statistic": statistic}
    seconds = seconds_per_call(fns, budget_s, repeats, **kwargs)
    return [GemmTiming(m, n, k, dtype, t) for (m, n, k), t in zip(shapes, seconds, strict=True)]


def matmul_peak(
    device: torch.device, dtype: str = "fp32", seconds: float = 0.3, size: int = 512
) -> float:
    """The best FLOP/s of square ``size`` products of hot operands over 5 trials in about
    ``seconds``."""
    shape = (size, size, size)
    (timing,) = measure_gemms(
        [shape], dtype, seconds, 5, cold_bytes=0, device=device, statistic=min
    )
    return timing.rate
