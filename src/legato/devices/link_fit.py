"""Fit collective laws (``devices.collectives``) to measured collective times.

The measurements come from ``legato calibrate`` (every collective between this host's
processes), from nccl-tests (``nccl_tests``) or from published sweeps (``micro``):

- ``fit_alpha_beta``: ``time = steps x latency + wire_bytes / bandwidth``, both free, on
  the ring formulas (``steps_and_wire_bytes``; a host measured at small and large sizes);
- ``fit_level``: NCCL's algorithm and protocol model with its own latencies, fitting the
  bus bandwidth share and the per-call latency of a link level (GPU clusters).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import least_squares

from legato.devices.collectives import nccl_time, steps_and_wire_bytes
from legato.devices.least_squares import fit_nonnegative


@dataclass(frozen=True)
class CommTiming:
    """Median seconds of one ``kind`` collective of ``nbytes`` over ``ranks`` processes;
    ``nbytes`` as in ``cost.collectives`` (the gathered tensor for all-gather and
    reduce-scatter, one rank's buffer for all-to-all and all-reduce, one message for p2p)."""

    kind: str
    nbytes: int
    ranks: int
    seconds: float

    @property
    def steps_and_wire(self) -> tuple[int, float]:
        return steps_and_wire_bytes(self.kind, self.nbytes, self.ranks)


@dataclass(frozen=True)
class LinkFit:
    """``latency_s`` per ring step and ``bandwidth`` (bytes/s each device sends); ``error``
    is the mean relative error of the fit over the timings it was fitted on."""

    latency_s: float
    bandwidth: float
    error: float

    def time(self, kind: str, nbytes: float, ranks: int) -> float:
        steps, wire = steps_and_wire_bytes(kind, nbytes, ranks)
        return steps * self.latency_s + wire / self.bandwidth


def fit_alpha_beta(timings: Sequence[CommTiming]) -> LinkFit:
    """Fit ``seconds = steps x alpha + wire / beta``, linear in ``(alpha, 1/beta)`` (when
    the latency hides the bytes entirely, the best rate seen stands for beta)."""
    alpha, inv_beta = fit_nonnegative(
        [x.steps_and_wire for x in timings], [x.seconds for x in timings]
    )
    if inv_beta <= 0:  # latency hides the bytes entirely: the best rate seen
        inv_beta = min(x.seconds / x.steps_and_wire[1] for x in timings if x.nbytes)
    fit = LinkFit(alpha, 1.0 / inv_beta, 0.0)
    error = statistics.fmean(
        abs(fit.time(x.kind, x.nbytes, x.ranks) / x.seconds - 1) for x in timings
    )
    return dataclasses.replace(fit, error=error)


def fit_level(
    timings: Sequence[CommTiming], bandwidth_gbps: float, network: bool,
    call_us: float | None = None,
) -> tuple[float, float, float, float]:  # fmt: skip
    """``(bus_fraction, call_latency_us, median, mean relative error)`` of NCCL's model
    (``devices.collectives.nccl_time``) on a link of nominal ``bandwidth_gbps``: least
    squares on the log of predicted over measured time, so every size weighs alike.
    ``call_us`` holds the call latency at that value (only the bus share is fitted)."""
    seconds = np.array([t.seconds for t in timings])

    def unpack(x: np.ndarray) -> tuple[float, float]:
        return math.exp(x[0]), call_us if call_us is not None else math.exp(x[1])

    def predicted(x: np.ndarray) -> np.ndarray:
        fraction, call = unpack(x)
        rate = bandwidth_gbps * fraction * 1e9
        return np.array([
            call * 1e-6 + nccl_time(t.kind, t.nbytes, t.ranks, rate, network) for t in timings
        ])  # fmt: skip

    start = [math.log(0.8)] + ([math.log(10.0)] if call_us is None else [])
    x = least_squares(lambda x: np.log(predicted(x) / seconds), start).x
    errors = np.abs(predicted(x) / seconds - 1)
    return *unpack(x), float(np.median(errors)), float(errors.mean())
