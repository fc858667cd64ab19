"""Strategy rows derived from the priced keys' table, not written by hand.

``coverage_rows(fits, moe)``: every example of ``specs.priced_keys.PRICED_KEYS`` a model
family can take, merged greedily into as few strategy strings as the runtime accepts
(``fits``: whether ``legato train`` resolves a string for that family on 2 processes), so
one launch per family trains every priced key at least once. Examples of refused values
(their row's reason), of MoE keys on a dense family, of other dtypes (compared with their
own one-process runs elsewhere) and of more than 2 processes (``test_strategies``' 4- and
8-process rows) are not rows here; ``left_out`` says which examples a family refuses.
"""

from __future__ import annotations

from collections.abc import Callable

from legato.specs.priced_keys import PRICED_KEYS
from legato.specs.strategy import Strategy

Fits = Callable[[str], bool]


def _items(text: str) -> dict[str, str]:
    return dict(item.split("=", 1) for item in text.split(","))


def _merge(a: dict[str, str], b: dict[str, str]) -> dict[str, str] | None:
    if any(a[k] != v for k, v in b.items() if k in a):
        return None
    return {**a, **b}


def _text(items: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in items.items())


def examples(moe: bool) -> list[str]:
    """The examples a family (MoE or not) can take on 2 processes, in table order."""
    return [
        text
        for row in PRICED_KEYS
        if (moe or not row.needs_moe) and row.key != "dtype"
        for text in row.examples
        if Strategy.parse(text).tp_y == 1
    ]  # fmt: skip


def coverage_rows(fits: Fits, moe: bool) -> tuple[list[str], list[str]]:
    """(rows, left_out): merged strategy strings that together turn on every example the
    family runs, and the examples it refuses alone."""
    rows: list[dict[str, str]] = []
    left_out = []
    for text in examples(moe):
        items = _items(text)
        for i, row in enumerate(rows):
            merged = _merge(row, items)
            if merged is not None and fits(_text(merged)):
                rows[i] = merged
                break
        else:
            if fits(text):
                rows.append(items)
            else:
                left_out.append(text)
    return [_text(row) for row in rows], left_out
