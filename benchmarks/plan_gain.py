"""Planner gain: the searched plan vs the hand heuristic, predicted by the cost model.

For each case (model, cluster preset, node count, global batch) ``legato.plan`` searches
the parallel space and the baseline heuristic (TP = GPUs per node capped by the heads,
PP just enough to fit, the rest DP, 1F1B, ZeRO-1, full recompute only if needed; ZeRO-3
if nothing fits that way) is scored by the same cost model. ``value`` is the planner's
predicted tokens/s, ``baseline_value`` the heuristic's, ``ratio = value / baseline_value``
(higher is better; null when the heuristic finds no plan). ``extra`` holds both
strategies, MFU, memory, the search time, and the best plan found *without* 2-D TP and
context parallelism: ``gain_from_2d_tp_or_cp`` > 1 marks the cases where they win.

Then one case's predicted throughput / memory Pareto front (every fitting candidate,
pruning of slow candidates off) is written as PNG and JSON under ``--out``.

    python benchmarks/plan_gain.py [--quick] [--out runs/benchmarks]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from legato.plan import PlanError, SearchSpace, make_plan, pareto_front, search
from legato.specs import load_cluster, load_model
from report import emit

BENCHMARK = "plan_gain"
# model: (global batch in sequences, node counts per cluster kind)
MODELS = {
    "llama3-8b": (512, {"small": 1, "mid": 8, "large": 64}),
    "llama3-70b": (1024, {"small": 8, "mid": 64, "large": 256}),
    "llama3-405b": (2048, {"small": 128, "mid": 512, "large": 2048}),
    "mixtral-8x22b": (64, {"small": 16, "mid": 64, "large": 256}),
    "deepseek-v3": (4096, {"small": 128, "mid": 256, "large": 1024}),
    "gpt3-310.1b": (1536, {"small": 64, "mid": 256, "large": 1024}),
}
CLUSTERS = ("dgx-a100", "dgx-h100", "h800", "rtx4090-pcie", "cloudmatrix384")
QUICK = [
    ("llama3-70b", "dgx-h100", 64),
    ("llama3-405b", "dgx-h100", 2048),
    ("gpt3-310.1b", "cloudmatrix384", 256),
    ("mixtral-8x22b", "h800", 64),
]
PARETO_CASE = ("llama3-70b", "dgx-h100", 8)


def _cases(quick: bool) -> list[tuple[str, str, int]]:
    if quick:
        return QUICK
    cases = []
    for model, (_, sizes) in MODELS.items():
        for cluster in CLUSTERS:
            for nodes in sorted(set(sizes.values())):
                cases.append((model, cluster, nodes))
    return cases


def run_case(model_name: str, cluster_name: str, nodes: int) -> None:
    model, cluster = load_model(model_name), load_cluster(cluster_name, nodes=nodes)
    gbs = MODELS[model_name][0]
    case = {"model": model_name, "cluster": cluster_name, "nodes": nodes,
            "devices": cluster.world_size, "gbs": gbs, "seq": model.seq_len}  # fmt: skip
    start = time.perf_counter()
    try:
        report = make_plan(model, cluster, gbs, top_k=3)
    except PlanError as exc:
        emit(
            BENCHMARK,
            case=case,
            metric="tokens_per_s",
            value=None,
            baseline="heuristic",
            baseline_value=None,
            ratio=None,
            extra={"error": str(exc)},
        )
        return
    elapsed = time.perf_counter() - start
    best = report.result.best
    plain = search(model, cluster, gbs, top_k=1, space=SearchSpace(two_d_tp=False, max_cp=1)).best
    base = report.baseline.plan
    value = best.prediction.tokens_per_s
    base_value = base.prediction.tokens_per_s if base else None
    extra = {
        "strategy": best.strategy.to_string(),
        "mfu": round(best.prediction.mfu, 4),
        "memory_gib": round(best.prediction.memory_gib, 1),
        "baseline_strategy": base.strategy.to_string() if base else None,
        "baseline_mfu": round(base.prediction.mfu, 4) if base else None,
        "baseline_note": report.baseline.reason,
        "uses_2d_tp": best.strategy.tp_y > 1,
        "uses_cp": best.strategy.cp > 1,
        "best_without_2d_tp_or_cp": plain.strategy.to_string() if plain else None,
        "gain_from_2d_tp_or_cp": round(value / plain.prediction.tokens_per_s, 4) if plain else None,
        "scored": report.result.stats.scored,
        "plan_seconds": round(elapsed, 2),
    }
    emit(
        BENCHMARK,
        case=case,
        metric="tokens_per_s",
        value=round(value),
        baseline="heuristic",
        baseline_value=round(base_value) if base_value else None,
        ratio=round(value / base_value, 4) if base_value else None,
        extra=extra,
    )


def pareto(out: Path) -> None:
    """Every fitting candidate of one case: predicted tokens/s against memory per device."""
    model_name, cluster_name, nodes = PARETO_CASE
    model, cluster = load_model(model_name), load_cluster(cluster_name, nodes=nodes)
    gbs = MODELS[model_name][0]
    result = search(model, cluster, gbs, top_k=1, space=SearchSpace(prune_slow=False))
    fitting = [s for s in result.scored if s.prediction.fits]
    front = pareto_front(result.scored)
    points = [
        {
            "strategy": s.strategy.to_string(),
            "tokens_per_s": s.prediction.tokens_per_s,
            "memory_gib": s.prediction.memory_gib,
            "front": s in front,
        }
        for s in fitting
    ]
    out.mkdir(parents=True, exist_ok=True)
    stem = out / "plan_gain_pareto"
    case = {"model": model_name, "cluster": cluster_name, "nodes": nodes, "gbs": gbs}
    stem.with_suffix(".json").write_text(json.dumps({"case": case, "points": points}, indent=1))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.scatter([p["memory_gib"] for p in points], [p["tokens_per_s"] for p in points], s=6,
               color="0.7", label=f"fitting candidates ({len(points)})")  # fmt: skip
    ax.plot([s.prediction.memory_gib for s in front], [s.prediction.tokens_per_s for s in front],
            "o-", color="C0", label="Pareto front")  # fmt: skip
    ax.axvline(cluster.device.memory_gib, color="C3", ls="--", lw=1, label="device memory")
    ax.set_xlabel("predicted memory per device (GiB)")
    ax.set_ylabel("predicted tokens/s")
    ax.set_title(f"{model_name} on {cluster.world_size} x {cluster_name}, gbs={gbs}")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(stem.with_suffix(".png"), dpi=120)
    plt.close(fig)
    files = {"png": str(stem.with_suffix(".png")), "json": str(stem.with_suffix(".json"))}
    emit(
        BENCHMARK,
        case=case,
        metric="pareto_points",
        value=len(front),
        baseline="fitting_candidates",
        baseline_value=len(points),
        ratio=round(len(front) / len(points), 4),
        extra=files,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="four cases, under a minute")
    parser.add_argument("--out", type=Path, default=Path("runs/benchmarks"))
    args = parser.parse_args()
    for case in _cases(args.quick):
        run_case(*case)
    pareto(args.out)


if __name__ == "__main__":
    main()
