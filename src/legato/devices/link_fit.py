"""Fit the alpha-beta link of ``cost.collectives`` to measured collective times.

The measurements come from ``legato calibrate`` (every collective between this host's
processes) or from nccl-tests (``cost.nccl``: all-reduce on a GPU cluster). Both fits
use the planner's own ring formulas (``steps_and_wire_bytes``), so what they return is
what the planner's collective times need:

- ``fit_alpha_beta``: ``time = steps x latency + wire_bytes / bandwidth``, both free (a
  host measured at small and large sizes);
- ``fit_collective_model``: the per-step latency held at the link's nominal value (sizes
  of 1 MB and up cannot separate it from a base latency), fitting the ``Calibration``
  constants ``base_latency_us`` and ``bandwidth_fraction``.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from legato.cost.collectives import steps_and_wire_bytes
from legato.cost.least_squares import fit_nonnegative


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


@dataclass(frozen=True)
class CollectiveFit:
    """Fitted constants (see ``Calibration``) and the relative errors they leave."""

    base_latency_us: float
    bandwidth_fraction: float
    mean_error: float
    p95_error: float
    max_error: float


def fit_collective_model(
    timings: Sequence[CommTiming], latency_us: float, bandwidth_gbps: float
) -> CollectiveFit:
    """Least squares on the relative error of ``t = base + steps * latency + wire /
    (fraction * bandwidth)``, linear in (base, 1/fraction), with the per-step latency held
    at the link's nominal ``latency_us``."""
    latency_s, bandwidth = latency_us * 1e-6, bandwidth_gbps * 1e9
    fixed = [x.steps_and_wire[0] * latency_s for x in timings]
    at_link_rate = [x.steps_and_wire[1] / bandwidth for x in timings]
    seconds = [x.seconds for x in timings]
    base, inv = fit_nonnegative([(1.0, w) for w in at_link_rate], seconds, fixed)
    errors = sorted(
        abs((base + f + w * inv) / t - 1)
        for f, w, t in zip(fixed, at_link_rate, seconds, strict=True)
    )
    return CollectiveFit(
        base_latency_us=base * 1e6,
        bandwidth_fraction=1.0 / inv,
        mean_error=sum(errors) / len(errors),
        p95_error=errors[int(0.95 * (len(errors) - 1))],
        max_error=errors[-1],
    )
