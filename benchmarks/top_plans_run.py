"""Do the plans the planner ranks first run? ``legato plan``'s top plans against ``legato train``.

For each case (a model on a cluster of some size, at a global batch) the planner ranks
its best ``--top`` plans (default 5) and each is resolved the way ``legato train`` resolves
its ``parallel.strategy`` before any process starts (``TrainConfig.job``: the runtime's
checks of every combination it refuses). A refused plan is a plan the planner would
recommend and the trainer would not run. The cases: the four model families of the tests
on this machine's cluster (``local-cpu``, 2, 4 and 8 processes) and published-scale jobs
on GPU presets (dense, GPT-style, MoE and MLA+MoE), where the planner's favourites combine
context parallelism with sequence-slice pipelines and expert parallelism folded over tp.

Rows: metric ``refused_plans``, ``value`` the refused count, ``baseline_value`` the plans
ranked (``ratio`` the refused share; the goal is 0), with the refused strategies and the
first line of each refusal, and the planner's seconds. ``--quick``: the local cases only.
"""

from __future__ import annotations

import argparse
import time

from report import emit

# (model, cluster, nodes or None for devices on one node, devices per node, global batch)
LOCAL = [(m, "local-cpu", None, n, 16) for m in ("tiny", "tiny-gpt", "tiny-moe", "tiny-deepseek")
         for n in (2, 4, 8)]  # fmt: skip
SCALE = [
    ("llama3-8b", "dgx-h100", 1, None, 256),
    ("llama3-70b", "dgx-h100", 8, None, 512),
    ("gpt3-175b", "dgx-a100", 16, None, 1536),
    ("mixtral-8x7b", "dgx-h100", 4, None, 512),
    ("qwen3-30b-a3b", "dgx-h100", 2, None, 512),
    ("qwen3-235b-a22b", "dgx-h100", 32, None, 2048),
    ("deepseek-v3", "h800", 32, None, 4096),
]


def refused_among_top(model: str, cluster_name: str, nodes: int | None, per_node: int | None,
                      gbs: int, top: int) -> tuple[int, list[str], float]:  # fmt: skip
    """(plans ranked, 'strategy: refusal' of each refused one, planner seconds)."""
    from legato.errors import LegatoError
    from legato.plan import SearchSpace, make_plan
    from legato.specs import load_cluster
    from legato.train.config import load_config, resolve_model

    config = load_config(None, [f"--model.preset={model}", f"--train.global_batch_size={gbs}"])
    spec = resolve_model(config.model)
    sizes = {"nodes": nodes or 1} | ({"devices_per_node": per_node} if per_node else {})
    cluster = load_cluster(cluster_name, **sizes)
    dtype = "fp32" if cluster_name == "local-cpu" else None  # as the CPU runs train
    space = SearchSpace(dtype=dtype) if dtype else SearchSpace()
    began = time.perf_counter()
    ranked = make_plan(spec, cluster, gbs, top_k=top, space=space).result.ranked
    seconds = time.perf_counter() - began
    refused = []
    for scored in ranked:
        text = scored.strategy.to_string()
        try:
            config.with_strategy(text).job(spec, scored.strategy.world_size)
        except LegatoError as exc:
            refused.append(f"{text}: {str(exc).splitlines()[0][-200:]}")
    return len(ranked), refused, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top", type=int, default=5, help="plans per case (default 5)")
    parser.add_argument("--quick", action="store_true", help="the local-cpu cases only")
    args = parser.parse_args()
    if args.top < 1:
        parser.error(f"--top: must be >= 1, got {args.top}")
    for model, cluster, nodes, per_node, gbs in LOCAL + ([] if args.quick else SCALE):
        ranked, refused, seconds = refused_among_top(model, cluster, nodes, per_node, gbs,
                                                     args.top)  # fmt: skip
        devices = f"{nodes} nodes" if nodes else f"{per_node} devices"
        emit("top_plans_run", {"model": model, "cluster": cluster, "size": devices, "gbs": gbs},
             "refused_plans", len(refused), "plans_ranked", ranked, refused=refused,
             plan_seconds=round(seconds, 1))  # fmt: skip


if __name__ == "__main__":
    main()
