"""Fit each law of a profile to micro-benchmark rows, and score it on rows it did not see.

Every fit is least squares on the log of predicted over measured time (a 5 us kernel
weighs as much as a 50 ms one). ``held_out`` refits without one group of rows at a time
(one model's shapes at one TP degree, one sequence length, a fifth of the message sizes)
and predicts that group: the
fit report is the median and mean absolute relative error over those predictions.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np
from scipy.optimize import least_squares

from legato.devices.collectives import LevelLaw
from legato.devices.laws import AttentionLaw, Fit, GemmLaw
from legato.devices.link_fit import CommTiming, fit_level
from legato.devices.micro import AttentionRow, GemmRow, StepRow
from legato.devices.profile import DTYPE_BYTES

Row = TypeVar("Row")


def _log_fit(predict: Callable[[np.ndarray], np.ndarray], seconds: np.ndarray, x0) -> np.ndarray:
    return least_squares(lambda x: np.log(predict(x) / seconds), np.log(x0)).x


def held_out(
    rows: Sequence[Row], group: Callable[[Row], str], fit_and_predict
) -> tuple[float, float] | None:
    """(median, mean) absolute relative error, in percent, predicting each group from a fit
    on the others; None with fewer than two groups. ``fit_and_predict(train, test)``
    returns (predicted, measured) seconds of ``test``."""
    groups = list(dict.fromkeys(map(group, rows)))
    if len(groups) < 2:
        return None
    errors: list[float] = []
    for g in groups:
        train = [r for r in rows if group(r) != g]
        test = [r for r in rows if group(r) == g]
        predicted, measured = fit_and_predict(train, test)
        errors += [abs(p / m - 1) for p, m in zip(predicted, measured, strict=True)]
    return 100 * statistics.median(errors), 100 * statistics.fmean(errors)


def fit_gemm(rows: Sequence[GemmRow], memory_gbs: float) -> tuple[float, float, float]:
    """(rate_tflops, half_dim, latency_us) of ``GemmLaw`` on ``rows``."""
    m, n, k, count, secs = (
        np.array([getattr(r, a) for r in rows]) for a in ["m", "n", "k", "count", "seconds"]
    )
    nbytes = np.array([DTYPE_BYTES[r.dtype] for r in rows]) * (m * k + k * n + m * n) * count

    def predict(x: np.ndarray) -> np.ndarray:
        rate, half, latency = np.exp(x)
        compute = 2 * m * n * k * count * (1 + half * (1 / m + 1 / n + 1 / k)) / (rate * 1e12)
        return latency * 1e-6 + np.maximum(compute, nbytes / (memory_gbs * 1e9))

    rate, half, latency = np.exp(_log_fit(predict, secs, [300.0, 32.0, 5.0]))
    return float(rate), float(half), float(latency)


def gemm_law(rows: Sequence[GemmRow], memory_gbs: float, evidence: str) -> GemmLaw:
    """The law fitted on every row, its report from leaving each group out."""
    rate, half, latency = fit_gemm(rows, memory_gbs)

    def fit_and_predict(train, test):
        law = GemmLaw(*fit_gemm(train, memory_gbs))
        return [_gemm_time(law, r, memory_gbs) for r in test], [r.seconds for r in test]

    many = len({r.group for r in rows}) >= 3  # else leave one shape out
    report = held_out(rows, (lambda r: r.group) if many else _shape, fit_and_predict)
    return GemmLaw(round(rate, 2), round(half, 2), round(latency, 3), _fit(evidence, report))


def _shape(r: GemmRow) -> str:
    return f"{r.m} {r.n} {r.k} {r.count}"


def _gemm_time(law: GemmLaw, r: GemmRow, memory_gbs: float) -> float:
    nbytes = DTYPE_BYTES[r.dtype] * (r.m * r.k + r.k * r.n + r.m * r.n) * r.count
    return law.time(r.m, r.n, r.k, r.count, nbytes, memory_gbs * 1e9)


def _fit(evidence: str, report: tuple[float, float] | None) -> Fit:
    if report is None:
        return Fit(True, evidence)
    return Fit(True, evidence, round(report[0], 2), round(report[1], 2))


def _attention_predict(rows: Sequence[AttentionRow]):
    b, q, kv, h, hkv, d, secs = (
        np.array([float(getattr(r, a)) for r in rows])
        for a in ["batch", "q", "kv", "heads", "kv_heads", "head_dim", "seconds"]
    )
    causal = np.array([r.causal for r in rows])
    pairs = q * kv - np.where(causal, q * (q - 1) / 2, 0.0)
    flops = 4 * b * h * pairs * d
    nbytes = 2 * b * d * (2 * kv * hkv + 2 * q * h)

    def predict(x: np.ndarray) -> np.ndarray:
        rate, q_half, kv_half, bandwidth, latency = np.exp(x)
        compute = flops * (1 + q_half / q + kv_half / kv) / (rate * 1e12)
        return latency * 1e-6 + np.maximum(compute, nbytes / (bandwidth * 1e9))

    return predict, secs


def fit_attention(rows: Sequence[AttentionRow]) -> tuple[float, ...]:
    """(rate_tflops, q_half, kv_half, kv_bandwidth_gbs, latency_us) on forward rows."""
    predict, secs = _attention_predict(rows)
    return tuple(
        float(v) for v in np.exp(_log_fit(predict, secs, [300.0, 16.0, 64.0, 1000.0, 5.0]))
    )


def attention_law(
    forward: Sequence[AttentionRow], backward_ratio: float, evidence: str
) -> AttentionLaw:
    def fit_and_predict(train, test):
        predict, secs = _attention_predict(test)
        return list(predict(np.log(fit_attention(train)))), list(secs)

    rate, q_half, kv_half, bandwidth, latency = fit_attention(forward)
    report = held_out(forward, lambda r: str(r.kv), fit_and_predict)
    return AttentionLaw(round(rate, 2), round(q_half, 2), round(kv_half, 2), round(bandwidth, 1),
                        round(latency, 3), round(backward_ratio, 3), _fit(evidence, report))  # fmt: skip


def backward_ratio(rows: Sequence[AttentionRow]) -> float:
    """Median backward over forward time of the same configuration."""

    def key(r: AttentionRow) -> tuple:
        return (r.batch, r.q, r.kv, r.heads, r.kv_heads, r.head_dim, r.causal, r.dtype)

    forward = {key(r): r.seconds for r in rows if not r.backward}
    ratios = [r.seconds / forward[key(r)] for r in rows if r.backward and key(r) in forward]
    return statistics.median(ratios)


def level_law(
    timings: Sequence[CommTiming], bandwidth_gbps: float, network: bool, evidence: str,
    call_us: float | None = None,
) -> LevelLaw:  # fmt: skip
    """NCCL's model with the level's bus share and call latency fitted (the latency held at
    ``call_us`` when given); reported by five-fold over the sizes (every fifth timing held
    out at a time: a rank count measured at one size only cannot be held out whole)."""
    fraction, call, _, _ = fit_level(timings, bandwidth_gbps, network, call_us)

    def fit_and_predict(train, test):
        f, c, _, _ = fit_level(train, bandwidth_gbps, network, call_us)
        law = LevelLaw(f, c)
        predicted = [
            law.time(t.kind, t.nbytes, t.ranks, bandwidth_gbps, 0.0, network) for t in test
        ]
        return predicted, [t.seconds for t in test]

    fold = {id(t): str(i % 5) for i, t in enumerate(sorted(timings, key=lambda t: t.nbytes))}
    report = held_out(timings, lambda t: fold[id(t)], fit_and_predict)
    return LevelLaw(round(fraction, 4), round(call, 3), fit=_fit(evidence, report))


def fit_steps(rows: Sequence[StepRow]) -> tuple[float, float, tuple[float, float] | None]:
    """(base_ms, per_sequence_ms, held-out report) of the engine's CPU time per step."""

    def line(train: Sequence[StepRow]) -> tuple[float, float]:
        slope, base = np.polyfit([r.batch for r in train], [r.seconds for r in train], 1)
        return max(float(base), 0.0) * 1e3, max(float(slope), 0.0) * 1e3

    def fit_and_predict(train, test):
        base, per = line(train)
        return [(base + per * r.batch) * 1e-3 for r in test], [r.seconds for r in test]

    base, per = line(rows)
    return round(base, 4), round(per, 5), held_out(rows, lambda r: r.group, fit_and_predict)


def relative_errors(predicted: Sequence[float], measured: Sequence[float]) -> tuple[float, float]:
    errors = [abs(p / m - 1) for p, m in zip(predicted, measured, strict=True)]
    return 100 * statistics.median(errors), 100 * statistics.fmean(errors)
