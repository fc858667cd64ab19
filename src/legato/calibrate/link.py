"""Measure the collectives between this host's processes (``cost.link_fit`` fits them).

Run inside an initialised process group (gloo on CPUs): every collective a training step
issues (all-reduce, all-gather, reduce-scatter, all-to-all) and a point-to-point
ping-pong, at a few message sizes. A trial is timed on every rank and counts as its
slowest rank's time (a collective is over when the last rank is done); each figure is
the median of a few trials.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

from legato.calibrate.timing import calls_per_trial
from legato.devices.collectives import COLLECTIVES
from legato.devices.link_fit import CommTiming

SIZES: tuple[int, ...] = (4 << 10, 32 << 10, 256 << 10, 2 << 20, 8 << 20)
QUICK_SIZES: tuple[int, ...] = (4 << 10, 256 << 10, 4 << 20)


def _collective(kind: str, nbytes: int, rank: int, world: int) -> Callable[[], None]:
    """One call of ``kind`` on fp32 buffers of ``nbytes`` (p2p: a ping-pong of ranks 0
    and 1, two messages; the others wait)."""
    n = max(world, nbytes // 4 // world * world)
    full, shard = torch.ones(n), torch.ones(n // world)
    if kind == "all_reduce":
        return lambda: dist.all_reduce(full)
    if kind == "all_gather":
        return lambda: dist.all_gather_single(full, shard)
    if kind == "reduce_scatter":
        return lambda: dist.reduce_scatter_single(shard, full)
    if kind == "all_to_all":
        out = torch.empty_like(full)
        return lambda: dist.all_to_all_single(out, full)
    if kind != "p2p":
        raise ValueError(f"unknown collective {kind!r}; known: {', '.join(COLLECTIVES)}")
    if rank == 0:
        return lambda: (dist.send(full, 1), dist.recv(full, 1))
    if rank == 1:
        return lambda: (dist.recv(full, 0), dist.send(full, 0))
    return lambda: None


def _slowest(seconds: list[float]) -> list[float]:
    box = torch.tensor(seconds, dtype=torch.float64)
    dist.all_reduce(box, op=dist.ReduceOp.MAX)
    return box.tolist()


def _slowest_one(seconds: float) -> float:
    return _slowest([seconds])[0]


def measure_collectives(
    sizes: Sequence[int],
    budget_s: float,
    kinds: Sequence[str] = COLLECTIVES,
    repeats: int = 5,
) -> list[CommTiming]:
    """Every ``kind`` at every size: the median over ``repeats`` trials of the slowest
    rank's seconds per call, in about ``budget_s`` seconds in all. Collective: every rank
    calls it with the same arguments. Trials are interleaved (one of each case per round)
    so that load from other processes lands on every case alike; the calls per trial are
    agreed by all ranks."""
    rank, world = dist.get_rank(), dist.get_world_size()
    cases = [(kind, nbytes) for kind in kinds for nbytes in sizes]
    fns = [_collective(kind, nbytes, rank, world) for kind, nbytes in cases]
    share = budget_s / repeats / len(fns)
    calls = [calls_per_trial(fn, share, _slowest_one) for fn in fns]
    trials: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        seconds = []
        for fn, n in zip(fns, calls, strict=True):
            dist.barrier()
            start = time.perf_counter()
            for _ in range(n):
                fn()
            seconds.append((time.perf_counter() - start) / n)
        for out, t in zip(trials, _slowest(seconds), strict=True):
            out.append(t)
    out = []
    for (kind, nbytes), t in zip(cases, trials, strict=True):
        p2p = kind == "p2p"  # a ping-pong carries the message twice
        median = statistics.median(t) / (2 if p2p else 1)
        out.append(CommTiming(kind, nbytes, 2 if p2p else world, median))
    return out
