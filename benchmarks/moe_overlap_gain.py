"""Predicted gain of MoE communication/computation overlap on the planner's plans.

For Mixtral 8x7B and DeepSeek-V3 (4,096-token sequences) on H800 clusters of a few sizes,
``legato.plan.search`` chooses the parallel degrees, expert parallelism and the MoE
overlap schedule (plain, Domino-EP, Comet with 2-4 chunks and 1-2 column groups); the
cost model (``legato.cost.training_step``) then scores the same plan with ``moe_overlap=none``.
Comet (MLSys'25) published 1.71x end to end and 1.96x per MoE layer on H800s.

One JSON line per case and plan (ratio = value / baseline_value, higher is better):

* ``metric: tokens_per_s``, ``plan: best``: the planner's best plan against the same plan
  without overlap (1.0 when the best plan has no expert parallelism or plain wins);
  ``plan: best_with_ep`` (only when the best plan has ``ep = 1``): the same for the best
  plan with ``ep >= 2``, where overlap can act at all. ``extra`` has the per-layer gain
  (routed experts and their all-to-alls, ``cost.moe_layer_time``), the all-to-all share of
  the plain layer, the share hidden, the exposed EP seconds per step of both, and the
  published anchors.
* ``metric: planner_tokens_per_s`` (not with ``--quick``): the best plan of a search with
  the overlap variants against the best of a search without them.

These are predictions of the calibrated cost model, not measurements.

    python benchmarks/moe_overlap_gain.py [--quick]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

from legato.cost.training_step import predict
from legato.plan import SearchSpace, search
from legato.specs import load_cluster, load_model
from legato.specs.strategy import Strategy
from report import emit, note

BENCHMARK = "moe_overlap_gain"
PUBLISHED = {"end_to_end": 1.71, "layer": 1.96}  # Comet, MLSys'25, on H800
SEQ = 4096
CASES = [  # model, H800 nodes, global batch (sequences)
    ("mixtral-8x7b", 2, 64),
    ("mixtral-8x7b", 8, 256),
    ("mixtral-8x7b", 32, 1024),
    ("deepseek-v3", 32, 512),
    ("deepseek-v3", 128, 2048),
    ("deepseek-v3", 256, 4096),
]
QUICK = [("mixtral-8x7b", 8, 256), ("deepseek-v3", 32, 512)]
PLAIN = (("none", 1, 1),)


def _without_overlap(strategy: Strategy) -> Strategy:
    return strategy.with_(moe_overlap="none", moe_chunks=1, moe_groups=1)


def plan_row(
    case: dict, label: str, model, cluster, space: SearchSpace, gbs: int
) -> Strategy | None:
    """One row for the planner's best plan in ``space``; returns its strategy."""
    start = time.process_time()
    best = search(model, cluster, gbs, space=space).best
    seconds = time.process_time() - start
    if best is None:
        note(BENCHMARK, case=case | {"plan": label}, error="no plan fits")
        return None
    plain = predict(model, cluster, _without_overlap(best.strategy))
    p = best.prediction
    extra = {
        "strategy": best.strategy.to_string(),
        "plan_cpu_s": round(seconds, 2),
        "exposed_ep_s": p.breakdown["exposed_comm_s"].get("ep", 0.0),
        "exposed_ep_s_plain": plain.breakdown["exposed_comm_s"].get("ep", 0.0),
        "step_time_s": p.step_time_s,
        "published_end_to_end_speedup": PUBLISHED["end_to_end"],
        "published_layer_speedup": PUBLISHED["layer"],
    }
    layer = p.breakdown.get("moe_overlap")
    if layer is not None:
        unhidden = plain.breakdown["moe_overlap"]
        extra |= {
            "schedule": f"{layer['schedule']} c{layer['chunks']} g{layer['groups']}",
            "layer_speedup": layer["plain_layer_s"] / layer["layer_s"],
            "comm_share_plain": unhidden["comm_s"] / unhidden["layer_s"],
            "hidden_fraction": layer["hidden_fraction"],
            "ep_level": p.breakdown["levels"]["ep"],
        }
    case = case | {"plan": label}
    emit(BENCHMARK, case, "tokens_per_s", p.tokens_per_s, "same_plan_moe_overlap_none",
         plain.tokens_per_s, extra=extra)  # fmt: skip
    return best.strategy


def planner_row(case: dict, model, cluster, gbs: int) -> None:
    """What the overlap dimension buys the planner: best plan with it vs without it."""
    results = {}
    for label, space in (("with", SearchSpace()), ("without", SearchSpace(moe_overlaps=PLAIN))):
        results[label] = search(model, cluster, gbs, space=space).best
    if results["with"] is None or results["without"] is None:
        return
    emit(
        BENCHMARK,
        case | {"plan": "search"},
        "planner_tokens_per_s",
        results["with"].prediction.tokens_per_s,
        "search_without_overlap_variants",
        results["without"].prediction.tokens_per_s,
        extra={
            "strategy": results["with"].strategy.to_string(),
            "baseline_strategy": results["without"].strategy.to_string(),
        },
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two cases, no planner rows")
    args = parser.parse_args()
    for name, nodes, gbs in QUICK if args.quick else CASES:
        model = load_model(name).with_(seq_len=SEQ)
        cluster = load_cluster("h800", nodes=nodes)
        case = {"model": name, "seq": SEQ, "devices": cluster.world_size, "gbs": gbs}
        best = plan_row(case, "best", model, cluster, SearchSpace(), gbs)
        if best is not None and best.ep == 1:  # where overlap can act at all
            plan_row(case, "best_with_ep", model, cluster, replace(SearchSpace(), min_ep=2), gbs)
        if not args.quick:
            planner_row(case, model, cluster, gbs)


if __name__ == "__main__":
    main()
