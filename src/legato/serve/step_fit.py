"""A step-time model fitted on one run's measured steps, for a machine whose step costs
no device profile prices: ``legato serve``'s own engine on a CPU (the tiny preset).

The model is a small mechanism, not a lookup: a step costs a fixed part (the scheduler,
the sampler, launching the layers), a part per request in the batch (legato's CPU engine
runs attention request by request), a part per new token (every layer's GEMMs), a part
per attended position (each new token's attention over its context: ``n * (start +
(n + 1) / 2)`` for ``n`` tokens after ``start`` cached ones) and a part per distinct
adapter (its factors read once). Its coefficients are the non-negative least-squares fit
of a decision log's step durations (``decisions.py``: each step's batch and ``t``), so a
model fitted on one run predicts another run's steps (``benchmarks/serving_sim_fidelity.py``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from scipy.optimize import nnls

from legato.serve.step_time import BatchRow

FEATURES = ("step", "request", "token", "attended_position", "adapter")


def features(rows: Sequence[BatchRow]) -> list[float]:
    """The batch's amounts of each of ``FEATURES``."""
    attended = sum(r.tokens * (r.context + (r.tokens + 1) / 2) for r in rows)
    adapters = len({r.adapter for r in rows if r.adapter is not None})
    return [1.0, len(rows), sum(r.tokens for r in rows), attended, adapters]


def logged_batches(
    records: Sequence[dict], adapter_of: Mapping[int, str | None]
) -> list[tuple[list[BatchRow], float]]:
    """Each step of a decision log that ran a batch, as its rows and its seconds
    (``adapter_of``: each request's adapter by engine sequence number)."""
    out = []
    for record in records:
        if "batch" not in record:
            continue
        (parts,) = record["batch"]
        rows = [BatchRow(n, start, adapter_of[seq]) for seq, n, start in parts]
        start, end = record["t"]
        out.append((rows, end - start))
    return out


class LinearStepTime:
    """Seconds of a step as ``coefficients . features(rows)`` (seconds per unit of each
    of ``FEATURES``)."""

    def __init__(self, coefficients: Sequence[float]) -> None:
        self.coefficients = list(coefficients)

    @classmethod
    def fit(cls, batches: Sequence[tuple[Sequence[BatchRow], float]]) -> LinearStepTime:
        """The non-negative least-squares fit of ``batches`` (rows, measured seconds)."""
        x = np.array([features(rows) for rows, _ in batches])
        y = np.array([seconds for _, seconds in batches])
        coefficients, _ = nnls(x, y)
        return cls(coefficients.tolist())

    def step_time(self, rows: Sequence[BatchRow]) -> float:
        return float(np.dot(self.coefficients, features(rows)))

    def as_dict(self) -> dict[str, float]:
        return dict(zip(FEATURES, self.coefficients, strict=True))
