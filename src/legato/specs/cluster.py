"""ClusterSpec: devices arranged in nested link levels (node, supernode, whole cluster).

Ranks are numbered node by node, so level ``i`` groups ``span`` consecutive ranks: rank
``r`` shares a level-``i`` domain with rank ``q`` when ``r // span == q // span``. The cost
model asks which level a collective's group crosses; a group is only as fast as the
slowest (outermost) level it spans.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from legato.errors import SpecError
from legato.specs.device import DeviceSpec, Link
from legato.specs.limits import MAX_DEVICES, check_at_most


@dataclass(frozen=True)
class LinkLevel(Link):
    """A link level: ``span`` devices (consecutive ranks) are reachable inside it;
    ``level`` says which (``intra_node``, ``supernode``, ``inter_node``: a device profile
    prices collectives per level)."""

    span: int
    level: str = "intra_node"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.span < 1:
            raise SpecError(f"{self.name}: span must be >= 1, got {self.span}")


@dataclass(frozen=True)
class ClusterSpec:
    """``nodes`` x ``devices_per_node`` devices; ``levels`` run inner to outer and the
    outermost spans every device."""

    name: str
    device: DeviceSpec
    nodes: int
    devices_per_node: int
    levels: tuple[LinkLevel, ...]
    description: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if self.nodes < 1:
            raise SpecError(f"cluster {self.name}: nodes must be >= 1, got {self.nodes}")
        if self.devices_per_node < 1:
            raise SpecError(
                f"cluster {self.name}: devices_per_node must be >= 1, got {self.devices_per_node}"
            )
        check_at_most(f"cluster {self.name}: nodes", self.nodes, MAX_DEVICES, SpecError)
        check_at_most(
            f"cluster {self.name}: nodes x devices_per_node",
            self.world_size,
            MAX_DEVICES,
            SpecError,
        )
        if not self.levels:
            raise SpecError(f"cluster {self.name}: needs at least one link level")
        spans = [level.span for level in self.levels]
        if spans != sorted(spans) or spans[-1] != self.world_size:
            raise SpecError(
                f"cluster {self.name}: level spans {spans} must grow inner to outer and end "
                f"at the world size {self.world_size}"
            )

    @property
    def world_size(self) -> int:
        return self.nodes * self.devices_per_node

    def level_of_ranks(self, ranks: Iterable[int]) -> LinkLevel:
        """Innermost level whose domain holds all of ``ranks``."""
        ranks = list(ranks)
        for rank in ranks:
            if not 0 <= rank < self.world_size:
                raise SpecError(
                    f"rank {rank} is outside the cluster (world size {self.world_size})"
                )
        for level in self.levels:
            if len({rank // level.span for rank in ranks}) <= 1:
                return level
        return self.levels[-1]

    def level_for_group(self, size: int, stride: int = 1) -> LinkLevel:
        """Slowest level crossed by the groups of one mesh axis: ``size`` ranks ``stride``
        apart, the groups tiling the world in aligned blocks of ``size * stride`` ranks
        (row-major device mesh). Every block fits in a domain of ``span`` ranks exactly
        when ``span`` is a multiple of the block, or one domain holds the whole world."""
        if size < 1 or stride < 1:
            raise SpecError(f"group size and stride must be >= 1, got {size} and {stride}")
        block = size * stride
        if size > 1 and (block > self.world_size or self.world_size % block):
            raise SpecError(
                f"a group of {size} ranks with stride {stride} does not tile the world "
                f"size {self.world_size}"
            )
        if size == 1:
            return self.levels[0]
        for level in self.levels:
            if level.span % block == 0 or level.span >= self.world_size:
                return level
        return self.levels[-1]
