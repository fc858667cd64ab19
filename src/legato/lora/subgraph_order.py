"""Ordering the compute and communication sub-graphs of fused groups so they overlap.

When the backbone is data- or tensor-parallel, each fused group's step is a chain of
compute sub-graphs (a layer's GEMMs) and communication sub-graphs (a tensor-parallel
all-reduce after a layer, or a data-parallel all-reduce of the adapters' gradients after
a layer's backward). One group alone leaves the network idle while it computes and the
GPU idle while it communicates; with two or more groups in flight, one group's
communication can run under another group's compute.

:func:`order_subgraphs` is list scheduling over the task graph of all groups: it keeps
the topological order (a sub-graph starts after its dependencies end) and, among the
ready sub-graphs, issues the one that can start earliest on its resource (load-aware:
each resource runs one sub-graph at a time), breaking ties by the longest remaining path
to the end of the graph (critical path first). Pure Python; the runtime that issues the
order on CUDA streams with a real process group is a follow-up (see docs/lora.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

Parallelism = Literal["dp", "tp"]


@dataclass(frozen=True)
class SubGraph:
    """A unit of work on one resource ("compute", "comm", ...) after its dependencies."""

    name: str
    resource: str
    duration: float
    deps: tuple[str, ...] = ()


@dataclass(frozen=True)
class Timeline:
    order: tuple[str, ...]  # issue order, a topological order of the graph
    start: dict[str, float]
    end: dict[str, float]

    @property
    def makespan(self) -> float:
        return max(self.end.values(), default=0.0)


def group_subgraphs(
    group: str, layers: int, compute_s: float, comm_s: float, parallelism: Parallelism
) -> list[SubGraph]:
    """The sub-graphs of one fused group's training step, per layer.

    ``tp``: every layer's forward and backward compute ends in an all-reduce the next
    layer waits for. ``dp``: the forward is compute only; each layer's backward is followed
    by an all-reduce of that layer's adapter gradients, which nothing in the step waits for.
    ``compute_s``/``comm_s`` are per layer and per direction (backward compute is 2x).
    """
    nodes: list[SubGraph] = []
    prev: tuple[str, ...] = ()
    for direction, layer_ids, scale in (
        ("fwd", range(layers), 1.0),
        ("bwd", reversed(range(layers)), 2.0),
    ):
        for i in layer_ids:
            c = SubGraph(f"{group}.{direction}{i}", "compute", compute_s * scale, prev)
            nodes.append(c)
            prev = (c.name,)
            if parallelism == "tp" or direction == "bwd":
                m = SubGraph(f"{group}.{direction}{i}.allreduce", "comm", comm_s, (c.name,))
                nodes.append(m)
                if parallelism == "tp":
                    prev = (m.name,)
    return nodes


def _check(nodes: Sequence[SubGraph]) -> dict[str, SubGraph]:
    by_name = {n.name: n for n in nodes}
    if len(by_name) != len(nodes):
        raise ValueError("sub-graph names must be unique")
    for n in nodes:
        unknown = [d for d in n.deps if d not in by_name]
        if unknown:
            raise ValueError(f"sub-graph {n.name!r} depends on unknown {unknown[0]!r}")
    return by_name


def _users(by_name: dict[str, SubGraph]) -> dict[str, list[str]]:
    users: dict[str, list[str]] = {name: [] for name in by_name}
    for n in by_name.values():
        for d in dict.fromkeys(n.deps):
            users[d].append(n.name)
    return users


def _remaining_path(by_name: dict[str, SubGraph]) -> dict[str, float]:
    """Longest duration from the start of each node to the end of the graph."""
    users = _users(by_name)
    memo: dict[str, float] = {}
    for name in _topological(by_name, users)[::-1]:
        memo[name] = by_name[name].duration + max((memo[u] for u in users[name]), default=0.0)
    return memo


def _topological(by_name: dict[str, SubGraph], users: dict[str, list[str]]) -> list[str]:
    indegree = {name: len(dict.fromkeys(n.deps)) for name, n in by_name.items()}
    ready = [name for name, k in indegree.items() if k == 0]
    order = []
    while ready:
        name = ready.pop()
        order.append(name)
        for u in users[name]:
            indegree[u] -= 1
            if indegree[u] == 0:
                ready.append(u)
    if len(order) != len(by_name):
        stuck = sorted(name for name, k in indegree.items() if k > 0)
        raise ValueError(f"sub-graphs form a cycle through {stuck[0]!r}")
    return order


def simulate_order(nodes: Sequence[SubGraph], order: Sequence[str]) -> Timeline:
    """Run ``order`` with one sub-graph at a time per resource, each as early as allowed."""
    by_name = _check(nodes)
    if sorted(order) != sorted(by_name):
        raise ValueError("the order must list every sub-graph exactly once")
    free: dict[str, float] = {}
    start: dict[str, float] = {}
    end: dict[str, float] = {}
    for name in order:
        n = by_name[name]
        if any(d not in end for d in n.deps):
            raise ValueError(f"{name!r} is ordered before one of its dependencies")
        begin = max([free.get(n.resource, 0.0), *(end[d] for d in n.deps)])
        start[name], end[name] = begin, begin + n.duration
        free[n.resource] = end[name]
    return Timeline(tuple(order), start, end)


def order_subgraphs(nodes: Sequence[SubGraph]) -> Timeline:
    """A topological issue order that overlaps resources (see the module docstring)."""
    by_name = _check(nodes)
    priority = _remaining_path(by_name)
    waiting = {name: set(n.deps) for name, n in by_name.items()}
    free: dict[str, float] = {}
    end: dict[str, float] = {}
    order: list[str] = []
    while waiting:
        ready = [name for name, deps in waiting.items() if deps <= end.keys()]

        def earliest(name: str) -> float:
            n = by_name[name]
            return max([free.get(n.resource, 0.0), *(end[d] for d in n.deps)])

        pick = min(ready, key=lambda name: (earliest(name), -priority[name], name))
        begin = earliest(pick)
        end[pick] = begin + by_name[pick].duration
        free[by_name[pick].resource] = end[pick]
        order.append(pick)
        del waiting[pick]
    return simulate_order(nodes, order)
