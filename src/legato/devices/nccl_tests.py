"""Read nccl-tests output as measured collectives (``devices.link_fit`` fits them).

``all_reduce_perf`` prints one row per message size: size in bytes, element count, type,
then time (us) and bus bandwidth for out-of-place and in-place runs (the calibration
files hold the time in ns instead: ``time_unit``). A user who measures their own cluster
feeds the rows to ``fit_laws.level_law`` (docs/cost_model.md, "Importing") and
puts the result in a device profile.
"""

from __future__ import annotations

import csv
from pathlib import Path

from legato.devices.link_fit import CommTiming
from legato.errors import DataError


def read_nccl_tests(path: str | Path, p: int, time_unit: float = 1e-9) -> list[CommTiming]:
    """Rows of an nccl-tests CSV (header, then size,count,type,time,busbw,time,busbw) as
    all-reduces over ``p`` devices; the time is the mean of the out-of-place and in-place
    runs."""
    rows = []
    try:
        with open(path, newline="") as f:
            for row in csv.reader(f):
                if not row or not row[0].strip().isdigit():
                    continue  # header or comment
                seconds = (float(row[3]) + float(row[5])) / 2 * time_unit
                rows.append(CommTiming("all_reduce", int(row[0]), p, seconds))
    except (OSError, ValueError, IndexError) as exc:
        raise DataError(f"{path}: not an nccl-tests table ({exc})") from None
    if not rows:
        raise DataError(f"{path}: no measurement rows")
    return rows
