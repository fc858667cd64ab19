"""Time a call on a shared machine: enough calls per trial, trials interleaved, a robust
statistic over them (single runs are noise when other processes share the cores)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence


def calls_per_trial(
    fn: Callable[[], object],
    share_s: float,
    agree: Callable[[float], float] = lambda seconds: seconds,
) -> int:
    """Calls of ``fn`` that take about ``share_s``: double the count until a batch takes
    a tenth of it (one fast call is a poor estimate on a loaded host, where most calls
    wait for a core), then scale. The batches double as warm-up. ``agree`` maps this
    process's batch time to the one to go by (for a collective: the slowest rank's)."""
    fn()
    calls = 1
    while True:
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        elapsed = agree(time.perf_counter() - start)
        if elapsed >= share_s / 10 or calls >= 1 << 20:
            return max(1, round(calls * share_s / max(elapsed, 1e-9)))
        calls *= 2


def seconds_per_call(
    fns: Sequence[Callable[[], object]],
    budget_s: float,
    repeats: int = 5,
    statistic: Callable[[list[float]], float] = statistics.median,
) -> list[float]:
    """``statistic`` (the median; ``min`` for a best case) over ``repeats`` trials of the
    seconds per call of each of ``fns``.

    The trials are interleaved (one of each function per round), so a burst of load from
    other processes on a shared machine lands on every function alike instead of on
    whichever was being timed; each trial runs as many calls as fit in its share of
    ``budget_s`` (at least one).
    """
    share = budget_s / repeats / len(fns)
    calls = [calls_per_trial(fn, share) for fn in fns]
    trials: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, n, out in zip(fns, calls, trials, strict=True):
            start = time.perf_counter()
            for _ in range(n):
                fn()
            out.append((time.perf_counter() - start) / n)
    return [statistic(t) for t in trials]
