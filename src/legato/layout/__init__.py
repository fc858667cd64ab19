"""SBP layouts: every op of a model part with DTensor-style placements on every mesh axis,
and the collectives they imply. Pure Python, below ``cost``: what a tensor layout sends is
derived here once, for the cost model (``cost.layer.tp_collectives``), the planner and the
runtime's tensor-parallel appliers."""

from legato.layout.errors import LayoutError
from legato.layout.placements import (
    PARTIAL,
    REPLICATE,
    Collective,
    Partial,
    Placement,
    Replicate,
    Shard,
    redistribute_cost,
)
from legato.layout.sbp_layout import (
    PARTS,
    PartLayout,
    backward_collectives,
    forward_collectives,
    part_layout,
)

__all__ = [
    "PARTIAL",
    "PARTS",
    "REPLICATE",
    "Collective",
    "LayoutError",
    "PartLayout",
    "Partial",
    "Placement",
    "Replicate",
    "Shard",
    "backward_collectives",
    "forward_collectives",
    "part_layout",
    "redistribute_cost",
]
