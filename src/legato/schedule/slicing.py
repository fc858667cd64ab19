"""Where to cut a sequence into k slices, and how much work each slice is.

Under causal attention a token attends to its whole prefix, so with a fraction ``a`` of a
full sequence's forward time spent in attention, the slice covering positions [s, e) of
the sequence (as fractions) costs ``(1 - a)(e - s) + a(e^2 - s^2)`` of the full forward:
linear layers scale with its tokens, attention with tokens times prefix. Equal-length
slices therefore get dearer towards the end; equal-FLOP slices are longer at the start.
"""

from __future__ import annotations

import math
from itertools import pairwise

from legato.schedule.errors import ScheduleError


def slice_bounds(slices: int, attention_share: float = 0.0) -> tuple[float, ...]:
    """k+1 cut points (fractions of the sequence) giving each slice equal forward work.

    With ``attention_share`` 0 this is equal-length slicing. Solves
    ``(1 - a) x + a x^2 = i / k`` for each cut ``x``.
    """
    if slices < 1:
        raise ScheduleError(f"slices: must be a positive integer, got {slices}")
    if not 0.0 <= attention_share < 1.0:
        raise ScheduleError(f"attention_share: must be in [0, 1), got {attention_share}")
    a = attention_share
    cuts = []
    for i in range(slices + 1):
        target = i / slices
        if a == 0.0:
            cuts.append(target)
        else:
            cuts.append((-(1 - a) + math.sqrt((1 - a) ** 2 + 4 * a * target)) / (2 * a))
    cuts[0], cuts[-1] = 0.0, 1.0
    return tuple(cuts)


def slice_work(bounds: tuple[float, ...], j: int, attention_share: float) -> float:
    """Share of a full sequence's work that slice ``j`` costs (shares sum to 1)."""
    s, e = bounds[j], bounds[j + 1]
    a = attention_share
    return (1 - a) * (e - s) + a * (e * e - s * s)


def token_bounds(bounds: tuple[float, ...], seq_len: int) -> tuple[int, ...]:
    """Cut points rounded to token positions, for the runtime that splits the batch."""
    cuts = tuple(round(x * seq_len) for x in bounds)
    if any(b <= a for a, b in pairwise(cuts)):
        raise ScheduleError(
            f"seq_len: {seq_len} tokens cannot be cut into {len(bounds) - 1} non-empty slices"
        )
    return cuts
