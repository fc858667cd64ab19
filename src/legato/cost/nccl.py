"""Read nccl-tests output and fit the collective model's constants to it.

``all_reduce_perf`` prints one row per message size: size in bytes, element count, type,
then time (us) and bus bandwidth for out-of-place and in-place runs (the calibration
files hold the time in ns instead: ``time_unit``). A user who measures their own cluster
feeds the file to ``fit_collective_model`` and puts the result in a ``Calibration``.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from legato.cost.collectives import steps_and_wire_bytes
from legato.errors import DataError


@dataclass(frozen=True)
class Measurement:
    """One measured collective: ``p`` devices, ``nbytes`` per device, ``seconds``."""

    p: int
    nbytes: float
    seconds: float


@dataclass(frozen=True)
class CollectiveFit:
    """Fitted constants (see ``Calibration``) and the relative errors they leave."""

    base_latency_us: float
    bandwidth_fraction: float
    mean_error: float
    p95_error: float
    max_error: float


def read_nccl_tests(path: str | Path, p: int, time_unit: float = 1e-9) -> list[Measurement]:
    """Rows of an nccl-tests CSV (header, then size,count,type,time,busbw,time,busbw);
    the time is the mean of the out-of-place and in-place runs."""
    rows = []
    try:
        with open(path, newline="") as f:
            for row in csv.reader(f):
                if not row or not row[0].strip().isdigit():
                    continue  # header or comment
                seconds = (float(row[3]) + float(row[5])) / 2 * time_unit
                rows.append(Measurement(p, float(row[0]), seconds))
    except (OSError, ValueError, IndexError) as exc:
        raise DataError(f"{path}: not an nccl-tests table ({exc})") from None
    if not rows:
        raise DataError(f"{path}: no measurement rows")
    return rows


def _features(m: Measurement, latency_s: float, bandwidth: float) -> tuple[float, float]:
    """(fixed latency seconds, seconds at full link bandwidth) of one all-reduce."""
    steps, wire = steps_and_wire_bytes("all_reduce", m.nbytes, m.p)
    return steps * latency_s, wire / bandwidth


def fit_collective_model(
    measurements: list[Measurement], latency_us: float, bandwidth_gbps: float
) -> CollectiveFit:
    """Least squares on the relative error of ``t = base + steps * latency + wire /
    (fraction * bandwidth)``, linear in (base, 1/fraction); the per-step latency is held
    at the link's nominal value because sizes of 1 MB and up cannot separate it from the
    base latency."""
    latency_s, bandwidth = latency_us * 1e-6, bandwidth_gbps * 1e9
    # Normal equations of sum(((base + x * inv + c) / t - 1)^2) in (base, inv).
    s_aa = s_ab = s_bb = s_ay = s_by = 0.0
    for m in measurements:
        fixed, x = _features(m, latency_s, bandwidth)
        w = 1.0 / m.seconds
        a, b, y = w, x * w, (m.seconds - fixed) * w
        s_aa, s_ab, s_bb = s_aa + a * a, s_ab + a * b, s_bb + b * b
        s_ay, s_by = s_ay + a * y, s_by + b * y
    det = s_aa * s_bb - s_ab * s_ab
    base = (s_ay * s_bb - s_ab * s_by) / det
    inv = (s_aa * s_by - s_ab * s_ay) / det
    errors = sorted(
        abs((base + fixed + x * inv) / m.seconds - 1)
        for m in measurements
        for fixed, x in [_features(m, latency_s, bandwidth)]
    )
    return CollectiveFit(
        base_latency_us=base * 1e6,
        bandwidth_fraction=1.0 / inv,
        mean_error=sum(errors) / len(errors),
        p95_error=errors[int(0.95 * (len(errors) - 1))],
        max_error=errors[-1],
    )
