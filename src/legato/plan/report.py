"""``make_plan``: search, compare with the hand heuristic, explain. What ``legato plan`` prints."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

from legato.plan.baseline import Baseline, baseline
from legato.plan.errors import PlanError
from legato.plan.explain import explain, no_fit_reason, runner_up_gap
from legato.plan.search import Scorer, SearchResult, default_scorer, search
from legato.plan.space import SearchSpace
from legato.specs.cluster import ClusterSpec
from legato.specs.model import ModelSpec


@dataclass
class PlanReport:
    model: ModelSpec
    cluster: ClusterSpec
    gbs: int
    result: SearchResult
    baseline: Baseline
    elapsed_s: float

    @property
    def gain(self) -> float | None:
        """Predicted throughput of the best plan over the heuristic's (None: no baseline)."""
        base = self.baseline.plan
        best = self.result.best
        if base is None or best is None or not base.prediction.tokens_per_s:
            return None
        return best.prediction.tokens_per_s / base.prediction.tokens_per_s

    @property
    def runner_up(self) -> str:
        ranked = self.result.ranked
        return runner_up_gap(ranked[0], ranked[1]) if len(ranked) > 1 else ""

    def to_dict(self) -> dict[str, Any]:
        base = self.baseline.plan
        return {
            "model": self.model.name,
            "cluster": self.cluster.name,
            "devices": self.cluster.world_size,
            "gbs": self.gbs,
            "seq_len": self.model.seq_len,
            "plans": [explain(self.model, s) for s in self.result.ranked],
            "runner_up": self.runner_up,
            "baseline": None if base is None else explain(self.model, base),
            "baseline_reason": self.baseline.reason,
            "gain_over_baseline": self.gain,
            "search": {**asdict(self.result.stats), "elapsed_s": self.elapsed_s},
        }


def make_plan(
    model: ModelSpec,
    cluster: ClusterSpec,
    gbs: int,
    *,
    top_k: int = 5,
    space: SearchSpace | None = None,
    scorer: Scorer | None = None,
) -> PlanReport:
    """Search, score the baseline heuristic and explain; PlanError if nothing fits."""
    scorer = scorer or default_scorer()
    start = time.perf_counter()
    result = search(model, cluster, gbs, top_k=top_k, space=space, scorer=scorer)
    if result.best is None:
        if not result.scored:
            why = result.stats.first_invalid or (
                f"gbs must be a multiple of mbs*dp with at least pp micro-batches, and none of "
                f"the {result.stats.shapes} factorisations allows that"
            )
            raise PlanError(
                f"no strategy for {model.name} on {cluster.world_size} devices with gbs={gbs} "
                f"passes the constraints: {why}"
            )
        raise PlanError(
            no_fit_reason(model, cluster.world_size, cluster.device.memory_gib, result.scored)
        )
    dtype = (space or SearchSpace()).dtype
    base = baseline(model, cluster, gbs, scorer=scorer, dtype=dtype)
    return PlanReport(model, cluster, gbs, result, base, time.perf_counter() - start)
