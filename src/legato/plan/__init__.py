"""The planner: SBP layouts of every op, the parallel search space, search scored by the
cost model, the hand heuristic it is compared with, and explanations. Pure Python."""

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
from legato.plan.baseline import Baseline, baseline
from legato.plan.errors import PlanError
from legato.plan.grad_sync import WeightCollectives, weight_collectives
from legato.plan.report import PlanReport, make_plan
from legato.plan.search import Scored, SearchResult, pareto_front, search
from legato.plan.space import SearchSpace, fast_domain

__all__ = [
    "PARTIAL",
    "PARTS",
    "REPLICATE",
    "Baseline",
    "Collective",
    "PartLayout",
    "Partial",
    "Placement",
    "PlanError",
    "PlanReport",
    "Replicate",
    "Scored",
    "SearchResult",
    "SearchSpace",
    "Shard",
    "WeightCollectives",
    "backward_collectives",
    "baseline",
    "fast_domain",
    "forward_collectives",
    "make_plan",
    "pareto_front",
    "part_layout",
    "redistribute_cost",
    "search",
    "weight_collectives",
]
