"""The hand heuristic users apply today, which the planner's gain is measured against.

Megatron-style recipe: tensor parallelism over the GPUs of one node (capped so that it
divides the heads, KV heads and vocabulary), sequence parallelism with it, just enough
pipeline stages to fit memory (1F1B, one sequence per micro-batch), the rest data
parallel with ZeRO-1 (the distributed optimizer), full recompute only if nothing fits
without it. If no pipeline degree fits that way (e.g. a layer count with few divisors),
users switch to FSDP: the same walk with ZeRO-3, which the result says. MoE models add
expert parallelism over the largest power-of-two divisor of the expert count that divides
the data-parallel ranks, with the plain all-to-all (no overlap). It trains in the
precision the user asked the planner for (``dtype``), so the gain is not a precision change.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from legato.errors import LegatoError
from legato.plan.search import Scored, Scorer, default_scorer
from legato.plan.space import is_valid
from legato.specs.cluster import ClusterSpec
from legato.specs.model import ModelSpec
from legato.specs.strategy import Strategy


@dataclass(frozen=True)
class Baseline:
    """The heuristic's plan (None if it finds none) and why it stopped."""

    plan: Scored | None
    reason: str = ""


def _largest_power_of_two(limit: int, divides: list[int]) -> int:
    tp = 1
    while tp * 2 <= limit and all(n % (tp * 2) == 0 for n in divides):
        tp *= 2
    return tp


def baseline_tp(model: ModelSpec, cluster: ClusterSpec) -> int:
    limit = min(cluster.devices_per_node, cluster.world_size)
    return _largest_power_of_two(limit, [model.num_heads, model.num_kv_heads, model.vocab_size])


def _ep(model: ModelSpec, dp: int) -> int:
    if model.moe is None:
        return 1
    return _largest_power_of_two(dp, [model.moe.num_experts, dp])


def baseline(
    model: ModelSpec,
    cluster: ClusterSpec,
    gbs: int,
    *,
    scorer: Scorer | None = None,
    dtype: str = "bf16",
) -> Baseline:
    """The heuristic's strategy for ``gbs`` sequences per step in ``dtype``, scored."""
    scorer = scorer or default_scorer()
    last = "no pipeline degree divides both the layers and the devices"
    for zero in (1, 3):
        for strategy in _walk(model, cluster, gbs, zero, dtype):
            problem = is_valid(strategy, model, cluster.world_size)
            if problem is not None:
                last = problem
                continue
            try:
                prediction = scorer(model, cluster, strategy)
            except LegatoError as exc:  # a rule the scorer knows (e.g. the runtime's)
                last = str(exc)
                continue
            if prediction.fits:
                note = (
                    ""
                    if zero == 1
                    else "nothing fits with ZeRO-1; the heuristic fell back to ZeRO-3"
                )
                return Baseline(Scored(strategy, prediction), note)
            last = f"{strategy.to_string()} does not fit: {prediction.why_not_fits}"
    return Baseline(None, f"the heuristic found no plan; last tried: {last}")


def _walk(
    model: ModelSpec, cluster: ClusterSpec, gbs: int, zero: int, dtype: str
) -> Iterator[Strategy]:
    """Pipeline degrees from small to large, each without and then with full recompute."""
    devices = cluster.world_size
    tp = baseline_tp(model, cluster)
    for pp in range(1, model.num_layers + 1):
        if model.num_layers % pp or (devices // tp) % pp:
            continue
        dp = devices // (tp * pp)
        for recompute in ("none", "full"):
            yield Strategy(
                dp=dp,
                tp=tp,
                pp=pp,
                ep=_ep(model, dp),
                sp=tp > 1,
                zero=zero if dp > 1 else 0,
                mbs=1,
                gbs=gbs,
                schedule="1f1b",
                recompute=recompute,
                dtype=dtype,
            )
