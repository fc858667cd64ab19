"""Reading a user's CSV file row by row, with every mistake named by flag, file and line.

Shared by the traces that the cluster and serving levels replay (Philly jobs, Azure requests):
both need the same refusals (a missing column, an unreadable file, no rows) worded the same.
"""

from __future__ import annotations

import csv
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from legato.errors import DataError

Row = TypeVar("Row")


def read_rows(
    path: str | Path,
    *,
    flag: str,
    columns: tuple[str, ...],
    format_name: str,
    row_kind: str,
    parse: Callable[[Path, int, dict], Row],
) -> list[Row]:
    """``parse(path, line, row)`` of every data row, in file order; ``parse`` raises the
    ``DataError`` for a malformed row (naming ``line``), this function for the file itself."""
    path = Path(path)
    try:
        with open(path, newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            missing = [c for c in columns if c not in (reader.fieldnames or [])]
            if missing:
                raise DataError(
                    f"{flag}: {path} lacks column(s) {missing}; {format_name} has "
                    f"{', '.join(columns)}"
                )
            rows = [parse(path, reader.line_num, row) for row in reader]
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"{flag}: cannot read {path} ({exc})") from None
    if not rows:
        raise DataError(f"{flag}: {path} has no {row_kind} rows")
    return rows
