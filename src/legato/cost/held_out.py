"""Fitting the compute constants, and scoring them on a source the fit did not see.

The figures that hold on runs nobody has given us are out-of-sample ones, so accuracy is
reported by leave-one-source-out: for each source, the constants are fitted on all the
others and the held-out source is predicted with them. The fit minimises the mean over
source tables of each table's mean relative error (every table weighs alike, so 1,440
vTrain rows do not drown 3 Llama 3 rows), by Powell's derivative-free search
(``scipy.optimize``): the error is piecewise smooth in the constants (maxima of compute
and memory time), which gradient methods handle badly. A table of more than
``FIT_ROWS_PER_TABLE`` rows is fitted on an even stride of that many (vTrain's sweep:
360 of 1,440; its mean error moves by well under a point) so one fit takes a minute, not
ten; the error reported is on every row.

Every fit starts from ``Constant.prior``, a public figure that no calibration row set,
and pays a small penalty for moving away from it (``PRIOR_WEIGHT``): a constant the
training sources cannot see (the host's launch cost without vTrain's small models) stays
at the prior instead of drifting, or keeping a value that the held-out source gave it.

One constant set per device generation and no constant per row or source: the GEMM
fraction of H100-class devices is fitted only when a training source ran on one; when
none did (Llama 3 held out), it is tied to the A100 fraction, the only honest transfer.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
from scipy.optimize import minimize

from legato.cost.calibration import CALIBRATION, Calibration
from legato.cost.published import Case, Result, evaluate

H100_CLASS = ("h100", "h200", "h800")
FIT_ROWS_PER_TABLE = 360
# Moving one of n free constants across its whole range from the prior costs this / n of
# table error (a third of a point with six): enough to hold a constant no source sees,
# too little to hold one that any source pins.
PRIOR_WEIGHT = 0.02


@dataclass(frozen=True)
class Constant:
    """One fitted field of Calibration, the range the search may move it in and the
    public figure it starts from."""

    name: str
    low: float
    high: float
    prior: float


FITTED = (
    # cuBLAS reaches 85-90% of the A100's 312 TFLOP/s on large isolated GEMMs; sustained
    # clocks in training are lower
    Constant("peak_fraction", 0.4, 0.95, 0.75),
    # H100 SXM: public sustained dense bf16 GEMM figures of 650-750 of 989 TFLOP/s
    Constant("h100_fraction", 0.3, 0.95, 0.70),  # peak_fraction_by_device of H100_CLASS
    # a 32-wide dimension fills a quarter of a 128-wide tile: about half the rate
    Constant("gemm_half_dim", 4.0, 256.0, 32.0),
    # FlashAttention-2: 50-73% of the A100 peak forward
    Constant("attention_fraction", 0.2, 1.0, 0.55),
    # STREAM-like copies reach 80-90% of the datasheet bandwidth
    Constant("memory_bw_fraction", 0.3, 0.95, 0.80),
    # PyTorch eager: 5-20 us of host time per operator (Python, dispatcher, autograd)
    Constant("launch_s", 0.0, 100e-6, 10e-6),
)
PRIOR_VALUES = {c.name: c.prior for c in FITTED}


def with_constants(base: Calibration, values: dict[str, float]) -> Calibration:
    """``base`` with the named fitted constants replaced (``h100_fraction`` sets every
    H100-class device's GEMM fraction)."""
    fields = {k: v for k, v in values.items() if k != "h100_fraction"}
    calibration = replace(base, **fields)
    if "h100_fraction" in values:
        kept = tuple(row for row in base.peak_fraction_by_device if row[0] not in H100_CLASS)
        h100 = tuple((name, values["h100_fraction"]) for name in H100_CLASS)
        calibration = replace(calibration, peak_fraction_by_device=kept + h100)
    return calibration


def constants_of(calibration: Calibration) -> dict[str, float]:
    values = {c.name: getattr(calibration, c.name) for c in FITTED if c.name != "h100_fraction"}
    values["h100_fraction"] = calibration.gemm_peak_fraction("h100")
    return values


def table_error(results: Sequence[Result]) -> float:
    """Mean over source tables of each table's mean absolute relative error."""
    tables: dict[str, list[float]] = {}
    for r in results:
        tables.setdefault(r.case.row["source"], []).append(r.error)
    return math.fsum(math.fsum(e) / len(e) for e in tables.values()) / len(tables)


@dataclass(frozen=True)
class Fit:
    calibration: Calibration
    error: float  # table_error on every training case
    evaluations: int


def thinned(cases: Sequence[Case], per_table: int = FIT_ROWS_PER_TABLE) -> list[Case]:
    """At most ``per_table`` cases of each source table, evenly strided, in order."""
    tables: dict[str, list[Case]] = {}
    for c in cases:
        tables.setdefault(c.row["source"], []).append(c)
    keep = set()
    for rows in tables.values():
        stride = max(1, -(-len(rows) // per_table))
        keep.update(id(c) for c in rows[::stride])
    return [c for c in cases if id(c) in keep]


def fit_constants(
    cases: Sequence[Case],
    base: Calibration = CALIBRATION,
    max_evaluations: int = 400,
    progress: Callable[[int, float], None] | None = None,
) -> Fit:
    """The FITTED constants minimising ``table_error`` on ``cases`` plus the pull to the
    priors, from the priors; every other field is ``base``'s."""
    on_h100 = any(c.cluster.device.name.lower().startswith(H100_CLASS) for c in cases)
    free = [c for c in FITTED if on_h100 or c.name != "h100_fraction"]
    everything, cases = list(cases), thinned(cases)
    count = 0

    def calibration_at(u: np.ndarray) -> Calibration:  # u in [0, 1]: each constant's range
        values = {c.name: c.low + float(v) * (c.high - c.low) for c, v in zip(free, u, strict=True)}
        if not on_h100:  # no H100 row to fit it on: the A100 fraction transfers
            values["h100_fraction"] = values["peak_fraction"]
        return with_constants(base, values)

    u0 = np.array([(c.prior - c.low) / (c.high - c.low) for c in free])

    def objective(u: np.ndarray) -> float:
        nonlocal count
        count += 1
        error = table_error(evaluate(calibration_at(u), cases))
        if progress is not None:
            progress(count, error)
        return error + PRIOR_WEIGHT * float(np.mean((u - u0) ** 2))

    result = minimize(
        objective,
        u0,
        method="Powell",
        bounds=[(0.0, 1.0)] * len(free),
        options={"maxfev": max_evaluations, "xtol": 1e-3, "ftol": 1e-4},
    )
    best = calibration_at(result.x)
    return Fit(best, table_error(evaluate(best, everything)), count)


@dataclass(frozen=True)
class HeldOut:
    """One source scored with constants fitted on every other source."""

    family: str
    fit: Fit
    results: list[Result]  # the held-out source's cases under ``fit.calibration``


def fit_without(
    cases: Sequence[Case],
    family: str,
    base: Calibration = CALIBRATION,
    max_evaluations: int = 400,
    progress: Callable[[int, float], None] | None = None,
) -> HeldOut:
    """One fold: fit on every source but ``family`` (a paper or table set, e.g. both of
    Korthikanti's tables), predict ``family``'s cases."""
    train = [c for c in cases if c.family != family]
    test = [c for c in cases if c.family == family]
    fit = fit_constants(train, base, max_evaluations, progress)
    return HeldOut(family, fit, evaluate(fit.calibration, test))


def leave_one_source_out(
    cases: Sequence[Case], base: Calibration = CALIBRATION, max_evaluations: int = 400
) -> list[HeldOut]:
    """Every fold, in the sources' first-seen order (folds are independent: the benchmark
    runs them in parallel through ``fit_without``)."""
    families = dict.fromkeys(c.family for c in cases)
    return [fit_without(cases, f, base, max_evaluations) for f in families]
