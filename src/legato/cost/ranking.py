"""Does the cost model rank alternative plans the way the measured runs did?

A planner is only as good as its ordering: a model 20% off everywhere still picks the best
plan, one 5% off in the wrong direction between two plans does not. A group is every
measured run of one job (same model shape, sequence, GPU type and count, global batch)
under different layouts; per group we report Spearman's rank correlation between
predicted and measured throughput and the pick regret: how much throughput the
predicted-best plan loses to the measured best.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import median
from typing import NamedTuple

from scipy.stats import spearmanr

from legato.cost.published import Result


class JobKey(NamedTuple):
    """What a group shares: the job, not how it was split."""

    source: str  # the family (paper or table set)
    shape: tuple[int, ...]  # layers, hidden, heads, FFN, vocabulary
    seq_len: int
    device: str
    devices: int
    gbs: int


def job_key(result: Result) -> JobKey:
    case = result.case
    m = case.counted
    shape = (m.num_layers, m.hidden_size, m.num_heads, m.ffn_hidden_size, m.vocab_size)
    return JobKey(case.family, shape, m.seq_len, case.cluster.device.name,
                  case.cluster.world_size, case.strategy.gbs)  # fmt: skip


@dataclass(frozen=True)
class GroupRanking:
    key: JobKey
    plans: int
    spearman: float | None  # None below three plans (two plans give only +-1)
    pairs: int  # pairs of plans whose measured throughputs differ
    pairs_right: int  # of those, pairs the prediction orders the same way
    regret: float  # 1 - measured(predicted best) / measured best
    predicted_best: str  # strategy strings
    measured_best: str


def rank_groups(results: Sequence[Result], min_plans: int = 2) -> list[GroupRanking]:
    """Every group of at least ``min_plans`` alternative plans, in first-seen order."""
    groups: dict[JobKey, list[Result]] = {}
    for r in results:
        groups.setdefault(job_key(r), []).append(r)
    rankings = []
    for key, members in groups.items():
        if len(members) < min_plans:
            continue
        predicted = [r.predicted_tokens_per_s for r in members]
        measured = [r.measured_tokens_per_s for r in members]
        pick = members[max(range(len(members)), key=predicted.__getitem__)]
        best = members[max(range(len(members)), key=measured.__getitem__)]
        rho = None
        if len(members) >= 3:
            value = float(spearmanr(predicted, measured).statistic)
            rho = None if math.isnan(value) else value  # nan: measured all equal
        right, pairs = ordered_pairs(predicted, measured)
        rankings.append(
            GroupRanking(
                key,
                len(members),
                rho,
                pairs,
                right,
                1 - pick.measured_tokens_per_s / best.measured_tokens_per_s,
                pick.case.strategy.to_string(),
                best.case.strategy.to_string(),
            )
        )
    return rankings


def ordered_pairs(predicted: Sequence[float], measured: Sequence[float]) -> tuple[int, int]:
    """(pairs ordered as measured, pairs) over every pair whose measured values differ; a
    predicted tie counts as wrong (the planner would pick either)."""
    right = pairs = 0
    for i in range(len(measured)):
        for j in range(i):
            if measured[i] == measured[j]:
                continue
            pairs += 1
            right += (predicted[i] - predicted[j]) * (measured[i] - measured[j]) > 0
    return right, pairs


def summary(rankings: Sequence[GroupRanking]) -> dict[str, float | int]:
    """Median and worst over groups (regret mean too: the expected loss of trusting it)."""
    rhos = sorted(g.spearman for g in rankings if g.spearman is not None)
    regrets = sorted(g.regret for g in rankings)
    out: dict[str, float | int] = {"groups": len(rankings), "ranked_groups": len(rhos)}
    pairs = sum(g.pairs for g in rankings)
    if pairs:
        out.update(pairs=pairs, pairs_right=sum(g.pairs_right for g in rankings) / pairs)
    if rhos:
        out.update(spearman_median=median(rhos), spearman_min=rhos[0])
    if regrets:
        out.update(
            regret_median=median(regrets),
            regret_mean=math.fsum(regrets) / len(regrets),
            regret_max=regrets[-1],
            picks_within_5pct=sum(r <= 0.05 for r in regrets) / len(regrets),
        )
    return out
