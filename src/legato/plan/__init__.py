"""The planner: the parallel search space, search scored by the cost model, the hand
heuristic it is compared with, and explanations. Pure Python. The SBP layouts it reads are
``legato.layout``."""

from legato.plan.baseline import Baseline, baseline
from legato.plan.errors import PlanError
from legato.plan.grad_sync import WeightCollectives, weight_collectives
from legato.plan.report import PlanReport, make_plan
from legato.plan.search import Scored, SearchResult, pareto_front, search
from legato.plan.space import SearchSpace, fast_domain

__all__ = [
    "Baseline",
    "PlanError",
    "PlanReport",
    "Scored",
    "SearchResult",
    "SearchSpace",
    "WeightCollectives",
    "baseline",
    "fast_domain",
    "make_plan",
    "pareto_front",
    "search",
    "weight_collectives",
]
