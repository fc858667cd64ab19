"""Median wall time of a CUDA callable, timed with CUDA events (shared by the GPU checks)."""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch


def cuda_median_seconds(fn: Callable[[], object], repeats: int, warmup: int) -> float:
    """Median seconds of ``fn`` over ``repeats`` calls after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)
