"""The benchmarks' output: one JSON object per line, in the row format of DESIGN.md.

A result row is ``{"benchmark", "case", "metric", "value", "baseline", "baseline_value",
"ratio", ...extra}`` with ``ratio = value / baseline_value`` (None when either is missing
or the baseline is zero). Rows without a baseline (a fit error, a count) leave the three
baseline keys out; rows that are not results at all (the device, a skip, an error) are
:func:`note`. Every benchmark prints through here so the format lives in one place.
Scripts run as ``python benchmarks/<name>.py``, so this module is imported as ``report``.
"""

from __future__ import annotations

import json
from typing import Any

_UNSET: Any = object()


def _rounded(x: Any, digits: int | None) -> Any:
    return x if digits is None or x is None else round(x, digits)


def result_row(
    benchmark: str,
    case: dict[str, Any],
    metric: str,
    value: Any,
    baseline: str | None = None,
    baseline_value: Any = None,
    *,
    ratio: Any = _UNSET,
    digits: int | None = None,
    ratio_digits: int | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """One result row. ``ratio`` defaults to ``value / baseline_value`` from the unrounded
    figures; ``digits`` rounds value and baseline value, ``ratio_digits`` the ratio."""
    row = {"benchmark": benchmark, "case": case, "metric": metric, "value": _rounded(value, digits)}
    if baseline is not None:
        if ratio is _UNSET:
            ratio = value / baseline_value if value is not None and baseline_value else None
        row |= {
            "baseline": baseline,
            "baseline_value": _rounded(baseline_value, digits),
            "ratio": _rounded(ratio, ratio_digits),
        }
    return row | extra


def print_row(row: dict[str, Any]) -> None:
    print(json.dumps(row), flush=True)


def emit(benchmark: str, case: dict[str, Any], metric: str, value: Any, *args: Any, **kwargs: Any):
    """Print :func:`result_row` (same arguments) as one line; return the row."""
    row = result_row(benchmark, case, metric, value, *args, **kwargs)
    print_row(row)
    return row


def note(benchmark: str, **fields: Any) -> dict[str, Any]:
    """Print a row that is not a result (the device, a skipped run, an error); return it."""
    row = {"benchmark": benchmark, **fields}
    print_row(row)
    return row
