"""The least squares every fit of measured times uses: on the *relative* error, so a
small measurement weighs as much as a large one, with coefficients held non-negative
(a latency or an inverse rate below zero is not physical)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def fit_nonnegative(
    rows: Sequence[Sequence[float]],
    seconds: Sequence[float],
    fixed: Sequence[float] | None = None,
) -> list[float]:
    """Coefficients ``c >= 0`` of ``seconds ~ rows @ c + fixed`` minimising the squared
    relative error; a coefficient the data want negative is held at 0 and the rest
    refitted. ``fixed``: a known part of each time (default none)."""
    t = np.asarray(seconds, dtype=float)
    x = np.asarray(rows, dtype=float) / t[:, None]
    target = np.ones(len(t)) if fixed is None else 1 - np.asarray(fixed, dtype=float) / t
    free = list(range(x.shape[1]))
    while True:
        coef, *_ = np.linalg.lstsq(x[:, free], target, rcond=None)
        if not free or coef.min() >= 0:
            out = [0.0] * x.shape[1]
            for i, c in zip(free, coef, strict=True):
                out[i] = float(c)
            return out
        free.pop(int(np.argmin(coef)))
