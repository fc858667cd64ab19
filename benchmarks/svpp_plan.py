"""SVPP planner evidence: the best sliced plan vs the best plan without slices, predicted.

MEPipe (EuroSys'25; references in docs/design.md) reports Llama-13B at 35% MFU on 64 RTX 4090 (24 GB,
PCIe) and a 1.35x mean speed-up over its baselines. Here ``legato.plan`` searches
Llama-2 13B (``llama2-13b``, 4,096-token sequences) on the ``rtx4090-pcie`` preset with 8
nodes (64 GPUs) twice per global batch (in sequences):

* (a) sliced: only the ``svpp`` schedule (``vpp=1`` is Seq1F1B's order) with slices 2 or 4.
  Shapes with ``pp=1`` run 1F1B unsliced whatever the schedule list says, so every
  candidate is scored (``prune_slow`` off, or plain plans could crowd the sliced ones out
  of the top-k) and the best fitting one with ``slices > 1`` is kept;
* (b) without slices: every schedule but ``svpp`` (all of them have ``slices == 1``).

``value`` is (a)'s predicted tokens/s, ``baseline_value`` (b)'s, ``ratio = value /
baseline_value``; ``extra`` holds both strategies with MFU, memory per GPU and step time,
plus a Megatron-like reference (no slices, ZeRO-1, no context parallelism) and the
unrestricted planner's choice. A last line gives the mean ratio against the published
1.35x. These are cost-model predictions, not measurements.

    python benchmarks/svpp_plan.py [--quick]
"""

from __future__ import annotations

import argparse
from statistics import mean

from legato.plan import Scored, SearchSpace, search
from legato.specs import load_cluster, load_model
from report import emit

BENCHMARK = "svpp_plan"
MODEL, CLUSTER, NODES = "llama2-13b", "rtx4090-pcie", 8
GBS = (64, 128, 256)  # sequences per step: 0.26M, 0.52M and 1.05M tokens
QUICK_GBS = (128,)
PUBLISHED = {"mfu": 0.35, "mean_speedup": 1.35}
UNSLICED = tuple(s for s in SearchSpace().schedules if s != "svpp")


def _plan(scored: Scored | None) -> dict:
    if scored is None:
        return {"strategy": None}
    p = scored.prediction
    return {
        "strategy": scored.strategy.to_string(),
        "tokens_per_s": round(p.tokens_per_s),
        "mfu": round(p.mfu, 4),
        "memory_gib": round(p.memory_gib, 2),
        "step_time_s": round(p.step_time_s, 3),
        "bubble_s": round(p.breakdown["bubble_s"], 3),
        "recompute_s": round(p.breakdown["recompute_s"], 3),
        "exposed_comm_s": {a: round(t, 3) for a, t in p.breakdown["exposed_comm_s"].items()},
    }


def best_sliced(model, cluster, gbs: int) -> Scored | None:
    """The fastest fitting plan with ``slices > 1`` (every svpp candidate scored)."""
    space = SearchSpace(schedules=("svpp",), prune_slow=False)
    result = search(model, cluster, gbs, top_k=1, space=space)
    sliced = [s for s in result.scored if s.prediction.fits and s.strategy.slices > 1]
    return min(sliced, key=Scored.rank_key, default=None)


def run_case(gbs: int) -> float | None:
    model, cluster = load_model(MODEL), load_cluster(CLUSTER, nodes=NODES)
    case = {"model": MODEL, "cluster": CLUSTER, "nodes": NODES,
            "devices": cluster.world_size, "gbs": gbs, "seq": model.seq_len}  # fmt: skip
    sliced = best_sliced(model, cluster, gbs)
    plain = search(model, cluster, gbs, top_k=1, space=SearchSpace(schedules=UNSLICED)).best
    megatron = SearchSpace(schedules=UNSLICED, zero_stages=(1,), max_cp=1)
    megatron_best = search(model, cluster, gbs, top_k=1, space=megatron).best
    planner = search(model, cluster, gbs, top_k=1).best
    value = sliced.prediction.tokens_per_s if sliced else None
    base = plain.prediction.tokens_per_s if plain else None
    ratio = value / base if value and base else None
    extra = {
        "svpp": _plan(sliced),
        "without_slices": _plan(plain),
        "megatron_like": _plan(megatron_best),
        "megatron_like_ratio": round(value / megatron_best.prediction.tokens_per_s, 4)
        if value and megatron_best
        else None,
        "planner_best": planner.strategy.to_string() if planner else None,
        "published": PUBLISHED,
    }
    emit(
        BENCHMARK,
        case=case,
        metric="tokens_per_s",
        value=round(value) if value else None,
        baseline="best_without_slices",
        baseline_value=round(base) if base else None,
        ratio=round(ratio, 4) if ratio else None,
        mfu=extra["svpp"].get("mfu"),
        memory_gib=extra["svpp"].get("memory_gib"),
        baseline_mfu=extra["without_slices"].get("mfu"),
        baseline_memory_gib=extra["without_slices"].get("memory_gib"),
        extra=extra,
    )
    return ratio


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one global batch (128)")
    args = parser.parse_args()
    sizes = QUICK_GBS if args.quick else GBS
    ratios = [r for r in (run_case(gbs) for gbs in sizes) if r is not None]
    if ratios:
        case = {"model": MODEL, "cluster": CLUSTER, "nodes": NODES, "gbs": list(sizes)}
        emit(
            BENCHMARK,
            case=case,
            metric="mean_speedup",
            value=round(mean(ratios), 4),
            baseline="published",
            baseline_value=PUBLISHED["mean_speedup"],
            ratio=round(mean(ratios) / PUBLISHED["mean_speedup"], 4),
        )


if __name__ == "__main__":
    main()
