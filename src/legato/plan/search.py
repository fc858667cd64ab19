"""Search the parallel space for the fastest strategies that fit, scored by the cost model.

For every factorisation and execution option (``plan.space``) the memory settings are
tried in a grid, ZeRO stage down and recompute (then chunked loss, then activation swap)
across (``space.memory_ladder``). Both
axes save memory and cost time, so once a cell fits, every cell below-right of it is
*dominated*: the walk tries each row only up to the first fitting cell and never further
right than the best row above. A schedule that fits at no memory setting for one
micro-batch size is not tried with larger ones. And the grid's first cell is its fastest:
if that is already slower than the k-th best plan found so far, the rest of the grid is
skipped (``SearchSpace.prune_slow``; off when every candidate is wanted, e.g. for a
Pareto front). With expert parallelism the MoE overlap variant (plain, Domino-EP,
Comet chunk and group counts) is chosen once per shape and micro-batch size, at the
first option's fastest memory cell: it changes how much all-to-all time hides behind
the expert GEMMs, not memory, and the same layer repeats under every schedule and memory
setting. The scorer is injected (``legato.cost.training_step.predict`` by default) so the
search can be tested against a known model.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from legato.errors import LegatoError
from legato.plan.errors import PlanError
from legato.plan.space import (
    SearchSpace,
    execution_options,
    fast_domain,
    is_valid,
    memory_ladder,
    overlap_variants,
    shapes,
    strategy_of,
)
from legato.specs.cluster import ClusterSpec
from legato.specs.limits import MAX_BATCH, check_at_most
from legato.specs.model import ModelSpec
from legato.specs.strategy import Strategy


class PredictionLike(Protocol):
    step_time_s: float
    tokens_per_s: float
    mfu: float
    memory_gib: float
    fits: bool
    why_not_fits: str
    breakdown: dict[str, Any]

    def to_dict(self) -> dict[str, Any]: ...


Scorer = Callable[[ModelSpec, ClusterSpec, Strategy], PredictionLike]


def default_scorer() -> Scorer:
    from legato.cost.training_step import predict  # the cost model; imported on first use

    return predict


@dataclass(frozen=True)
class Scored:
    strategy: Strategy
    prediction: PredictionLike

    def rank_key(self) -> tuple[float, float, str]:
        """Fastest first; ties go to the smaller memory footprint, then the string."""
        p = self.prediction
        return (-p.tokens_per_s, p.memory_gib, self.strategy.to_string())


@dataclass
class SearchStats:
    shapes: int = 0
    candidates: int = 0
    invalid: int = 0
    scored: int = 0
    fits: int = 0
    skipped_dominated: int = 0
    skipped_slow: int = 0
    first_invalid: str = ""


@dataclass
class SearchResult:
    """Ranked fitting plans (best first), every scored candidate, and counts."""

    ranked: list[Scored]
    scored: list[Scored] = field(repr=False)
    stats: SearchStats

    @property
    def best(self) -> Scored | None:
        return self.ranked[0] if self.ranked else None


def _walk_ladder(
    grid: list[Sequence[Strategy]],
    score: Callable[[Strategy], Scored | None],
    stats: SearchStats,
    threshold: float,
) -> bool | None:
    """Score the non-dominated cells of the memory grid. True if one fitted, False if
    none did, None if the grid was abandoned: its fastest cell (the first) is no faster
    than ``threshold`` tokens/s, so no cell of it can make the top-k. A fitting cell with
    a smaller SVPP memory cap does not end its row: the cap's bubble may cost more than
    the recompute to its right."""
    limit = len(grid[0])  # cells at or right of a fitting column are dominated
    tried, fitted = 0, False
    cells = sum(len(row) for row in grid)
    for row in grid:
        for col in range(limit):
            tried += 1
            scored = score(row[col])
            fits = scored is not None and scored.prediction.fits
            fitted |= fits
            if fits and not row[col].memory_cap:
                limit = col
                break
            if tried == 1 and scored is not None and scored.prediction.tokens_per_s <= threshold:
                stats.skipped_slow += cells - tried
                return None
        if limit == 0:
            break
    stats.skipped_dominated += cells - tried
    return fitted


def search(
    model: ModelSpec,
    cluster: ClusterSpec,
    gbs: int,
    *,
    top_k: int = 5,
    space: SearchSpace | None = None,
    scorer: Scorer | None = None,
) -> SearchResult:
    """The ``top_k`` fastest strategies for ``gbs`` sequences per step that fit."""
    if gbs < 1:
        raise PlanError(f"gbs must be >= 1, got {gbs}")
    check_at_most("gbs", gbs, MAX_BATCH, PlanError)
    space = space or SearchSpace()
    scorer = scorer or default_scorer()
    devices = cluster.world_size
    max_tp = space.max_tp or fast_domain(cluster)
    stats = SearchStats()
    scored: list[Scored] = []
    best: list[float] = []  # min-heap of the top_k fitting throughputs so far
    seen: dict[Strategy, Scored | None] = {}

    def score(strategy: Strategy) -> Scored | None:
        if strategy in seen:
            return seen[strategy]
        seen[strategy] = result = _score(strategy)
        return result

    def _score(strategy: Strategy) -> Scored | None:
        stats.candidates += 1
        problem = is_valid(strategy, model, devices)
        prediction = None
        try:
            if problem is None:
                prediction = scorer(model, cluster, strategy)
        except LegatoError as exc:  # a rule the cost model knows and the space does not
            problem = str(exc)
        if prediction is None:
            stats.invalid += 1
            stats.first_invalid = stats.first_invalid or problem
            return None
        stats.scored += 1
        result = Scored(strategy, prediction)
        stats.fits += result.prediction.fits
        scored.append(result)
        if result.prediction.fits:
            heapq.heappush(best, result.prediction.tokens_per_s)
            if len(best) > top_k:
                heapq.heappop(best)
        return result

    def threshold() -> float:
        return best[0] if space.prune_slow and len(best) == top_k else -1.0

    for shape in shapes(model, devices, space, max_tp):
        stats.shapes += 1
        failed: set[tuple] = set()  # schedules that fit at no memory setting
        overlap: dict[int, Strategy] = {}  # the fastest MoE overlap variant by mbs
        for options in execution_options(model, shape, gbs, space):
            schedule = tuple((k, v) for k, v in options.items() if k != "mbs")
            if schedule in failed:
                continue  # it failed at a smaller micro-batch, which needs less memory
            base = strategy_of(shape, options, gbs, space)
            if options["mbs"] not in overlap:
                variants = overlap_variants(model, base, space)
                overlap[options["mbs"]] = _fastest(variants, score, threshold())
            chosen = overlap[options["mbs"]]
            base = base.with_(
                moe_overlap=chosen.moe_overlap,
                moe_chunks=chosen.moe_chunks,
                moe_groups=chosen.moe_groups,
            )
            grid = memory_ladder(model, base, space)
            if _walk_ladder(grid, score, stats, threshold()) is False:
                failed.add(schedule)
    fitting = sorted((s for s in scored if s.prediction.fits), key=Scored.rank_key)
    return SearchResult(fitting[:top_k], scored, stats)


def _fastest(
    variants: list[Strategy], score: Callable[[Strategy], Scored | None], threshold: float
) -> Strategy:
    """The fastest of ``variants`` (the first, plain, on ties or when none can be scored).
    The others are not scored when hiding all of the first's exposed expert-parallel
    traffic could not lift it above ``threshold`` tokens/s (overlap hides no more)."""
    first = score(variants[0])
    if first is None or len(variants) == 1:
        return variants[0]
    p = first.prediction
    exposed = p.breakdown.get("exposed_comm_s", {}).get("ep", 0.0)
    if p.tokens_per_s * p.step_time_s / (p.step_time_s - exposed) <= threshold:
        return variants[0]
    best, fastest = variants[0], p.tokens_per_s
    for variant in variants[1:]:
        result = score(variant)
        if result is not None and result.prediction.tokens_per_s > fastest:
            best, fastest = variant, result.prediction.tokens_per_s
    return best


def pareto_front(scored: list[Scored]) -> list[Scored]:
    """Fitting plans not beaten on both throughput and memory, by increasing memory."""
    front: list[Scored] = []
    best = -1.0
    for s in sorted(
        (s for s in scored if s.prediction.fits),
        key=lambda s: (s.prediction.memory_gib, -s.prediction.tokens_per_s),
    ):
        if s.prediction.tokens_per_s > best:
            front.append(s)
            best = s.prediction.tokens_per_s
    return front
