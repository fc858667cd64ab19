"""The communication groups of a Strategy and the link level each one crosses.

Ranks are laid out row-major over ``pp, dp, cp, tp`` (outer to inner, see
``specs/strategy.py``): an axis of size ``n`` has stride equal to the product of the
degrees inside it, and ``ClusterSpec.level_for_group(n, stride)`` gives the slowest link its
groups cross. 2-D tensor parallelism splits ``tp`` into ``tp_x`` (inner, stride 1) and
``tp_y`` (stride ``tp_x``). Gradients are reduced over the ``dp x cp`` ranks that hold
the same weights (stride ``tp``); expert parallelism folds over those same ranks,
innermost first (stride ``tp``), and expert weights are reduced over the remaining
``dp cp / ep`` ranks (stride ``tp ep``). When ``ep`` does not divide ``dp cp`` it folds
over the ``tp dp cp`` ranks instead (Megatron-Core's parallel folding: stride 1, so a
group of up to a node's GPUs stays on its fastest link) and the experts are reduced over
``tp dp cp / ep`` ranks (stride ``ep``).

Hierarchical collectives: when ``g`` members of a group sit in each domain of the level
below its slowest one (e.g. all 8 GPUs of a node in one data-parallel group), NCCL runs one
ring per device link and each domain receives the data once, so ring collectives use the
``g`` devices' outer links together: ``g`` times the level's per-device bandwidth, capped
by the inner level's. Point-to-point traffic does not gain (each device's data goes to
one peer). An all-to-all sends ``(g - 1)/p`` of each buffer to the ``g - 1`` members of
its own domain over the inner link and ``(p - g)/p`` out over its own outer link, both at
once; it is priced as the whole ``(p - 1)/p`` at the bandwidth that takes as long
(``(p - 1) / max((p - g)/outer, (g - 1)/inner)``), so an EP group half inside a node
moves half its bytes at NVLink speed. ``Axis.link(kind)`` gives the link a collective sees.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from legato.specs.cluster import ClusterSpec, LinkLevel
from legato.specs.strategy import Strategy


@dataclass(frozen=True)
class Axis:
    """One communication group type: ``size`` ranks ``stride`` apart over ``level``."""

    name: str
    size: int
    stride: int
    level: LinkLevel
    ring: LinkLevel  # the level with the bandwidth ring collectives reach (see above)
    a2a: LinkLevel  # the level with the bandwidth an all-to-all reaches (see above)

    def link(self, kind: str) -> LinkLevel:
        if kind == "p2p":
            return self.level
        return self.a2a if kind == "all_to_all" else self.ring


def _inner_domain(
    cluster: ClusterSpec, size: int, stride: int, level: LinkLevel
) -> tuple[int, LinkLevel]:
    """Members of one group inside one domain of the level below ``level`` (1: none, or
    no level below), and that inner level."""
    index = cluster.levels.index(level)
    if index == 0 or size == 1:
        return 1, level
    inner = cluster.levels[index - 1]
    return (min(size, inner.span // stride) if stride < inner.span else 1), inner


def _ring_level(cluster: ClusterSpec, size: int, stride: int, level: LinkLevel) -> LinkLevel:
    per_domain, inner = _inner_domain(cluster, size, stride, level)
    if per_domain <= 1:
        return level
    bandwidth = min(level.bandwidth_gbps * per_domain, inner.bandwidth_gbps)
    return replace(level, bandwidth_gbps=bandwidth)


def _a2a_level(cluster: ClusterSpec, size: int, stride: int, level: LinkLevel) -> LinkLevel:
    g, inner = _inner_domain(cluster, size, stride, level)
    if g <= 1:
        return level
    slowest = max((size - g) / level.bandwidth_gbps, (g - 1) / inner.bandwidth_gbps)
    return replace(level, bandwidth_gbps=(size - 1) / slowest)


def _pp_level(cluster: ClusterSpec, pp: int, stride: int) -> LinkLevel:
    """Slowest link between neighbouring stages (pipeline traffic is point-to-point)."""
    if pp == 1:
        return cluster.levels[0]
    pairs = ((i * stride, (i + 1) * stride) for i in range(pp - 1))
    levels = [cluster.level_of_ranks(pair) for pair in pairs]
    return max(levels, key=cluster.levels.index)


def mesh_axes(strategy: Strategy, cluster: ClusterSpec) -> dict[str, Axis]:
    """Axes by name: ``tp`` (or ``tp_x`` and ``tp_y``), ``cp``, ``dp`` (gradient group,
    dp x cp), ``ep``, ``edp`` (expert gradient group) and ``pp``. Axes of size one are
    included with the innermost level (they send nothing)."""
    s = strategy
    groups = [("cp", s.cp, s.tp), ("dp", s.dp * s.cp, s.tp)]
    if s.tp_y > 1:
        groups += [("tp_x", s.tp_x, 1), ("tp_y", s.tp_y, s.tp_x)]
    else:
        groups.append(("tp", s.tp, 1))
    if s.ep > 1:
        inner = 1 if s.folded_ep else s.tp  # the stride of the ranks EP folds over
        groups += [("ep", s.ep, inner), ("edp", s.expert_dp, inner * s.ep)]
    axes = {}
    for name, size, stride in groups:
        level = cluster.level_for_group(size, stride)
        ring = _ring_level(cluster, size, stride, level)
        axes[name] = Axis(name, size, stride, level, ring, _a2a_level(cluster, size, stride, level))
    pp_stride = s.dp * s.cp * s.tp
    level = _pp_level(cluster, s.pp, pp_stride)
    axes["pp"] = Axis("pp", s.pp, pp_stride, level, level, level)
    return axes
