"""Latency-bandwidth (alpha-beta) time of the collectives a training step issues.

For ``p`` devices on a link of latency ``a`` and bandwidth ``b`` per device (one direction)
and a tensor of ``nbytes``:

* ring all-gather / reduce-scatter: ``(p-1) a + nbytes (p-1)/p / b``, where ``nbytes`` is
  the full (gathered) tensor;
* all-to-all: ``(p-1) a + nbytes (p-1)/p / b``, where ``nbytes`` is one device's buffer
  (the share ``1/p`` of it that stays local is not sent);
* all-reduce (reduce-scatter then all-gather): ``2 (p-1) a + 2 nbytes (p-1)/p / b``;
* point-to-point: ``a + nbytes / b``.

Measured NCCL sits below this ideal: each call pays a launch latency and reaches only a
fraction of the link bandwidth. Both come from ``Calibration`` (fitted on measured A100
all-reduce, see ``legato.cost.link_fit``) and apply to every link level alike.
"""

from __future__ import annotations

from typing import Literal

from legato.cost.calibration import CALIBRATION, Calibration
from legato.specs.device import Link

Collective = Literal["all_gather", "reduce_scatter", "all_to_all", "all_reduce", "p2p"]
COLLECTIVES: tuple[str, ...] = ("all_gather", "reduce_scatter", "all_to_all", "all_reduce", "p2p")


def steps_and_wire_bytes(kind: Collective, nbytes: float, p: int) -> tuple[int, float]:
    """(latency steps, bytes each device sends) of the ideal ring algorithm."""
    if kind == "p2p":
        return 1, nbytes
    if p <= 1:
        return 0, 0.0
    share = (p - 1) / p
    if kind in ("all_gather", "reduce_scatter", "all_to_all"):
        return p - 1, nbytes * share
    if kind == "all_reduce":
        return 2 * (p - 1), 2 * nbytes * share
    raise ValueError(f"unknown collective {kind!r}; known: {', '.join(COLLECTIVES)}")


def ideal_time(
    kind: Collective, nbytes: float, p: int, latency_s: float, bandwidth: float
) -> float:
    """The textbook alpha-beta time (seconds) with ``bandwidth`` in bytes/s."""
    steps, wire = steps_and_wire_bytes(kind, nbytes, p)
    return steps * latency_s + wire / bandwidth


def collective_time(
    kind: Collective,
    nbytes: float,
    p: int,
    link: Link,
    calibration: Calibration = CALIBRATION,
    *,
    bandwidth_share: float = 1.0,
) -> float:
    """Seconds for one collective on a group of ``p`` devices whose slowest link is
    ``link``; ``bandwidth_share`` (0-1] is the part of the link left by concurrent traffic
    of other mesh axes. Zero for a group of one (nothing is sent)."""
    if nbytes <= 0 or (p <= 1 and kind != "p2p"):
        return 0.0
    latency_us, gbps = link.latency_us, link.bandwidth_gbps
    for fitted_kind, fitted_latency_us, fitted_gbps in calibration.collective_fits:
        if fitted_kind == kind:
            latency_us, gbps = fitted_latency_us, fitted_gbps
    latency = calibration.latency_scale * latency_us * 1e-6
    bandwidth = gbps * 1e9 * calibration.bandwidth_fraction * bandwidth_share
    return calibration.base_latency_us * 1e-6 + ideal_time(kind, nbytes, p, latency, bandwidth)
