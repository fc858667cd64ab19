"""Fit the cost model's GEMM law to measured matrix products.

The law is ``devices.laws.GemmLaw``'s without its latency: a ``[M, K] x [K, N]`` product
runs at ``R / (1
+ d0/M + d0/N + d0/K)``. ``fit_gemm_rate`` recovers the asymptotic rate ``R`` and the
half-efficiency size ``d0`` by linear least squares on the relative error
(``fit_nonnegative``), so a small GEMM weighs as much as a large one.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from legato.devices.least_squares import fit_nonnegative


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
