"""Cost model accuracy: predicted vs measured for every run in the calibration sets.

Each row of ``legato/cost/data/published_runs.csv`` (Megatron-LM SC'21 Table 1,
Korthikanti et al. Tables 3/5 and text, MT-NLG, Llama 3 Table 4, torchtitan), of
MosaicML's FSDP table and of vTrain's single-node sweep becomes a (model, cluster,
strategy) triple; ``legato.cost.training_step`` predicts its step and the
prediction is converted into the row's own metric with the source's own FLOP formula
(``legato.cost.published``, whose ``ASSUMPTIONS`` list how each source's gaps are
filled). One global set of constants (``legato.cost.calibration``) serves every row.

Output, one JSON object per line: the rejected rows (goal: none); per row ``value`` (predicted) vs ``baseline_value``
(published) with ``ratio = value / baseline_value`` (1 is perfect; for iteration time
above 1 means predicted slower, for throughput metrics predicted faster); then per source
table ``mean_abs_pct_error`` and ``max_abs_pct_error`` (lower is better, goal < 10); then
the A100 profile's collective law and its held-out error on micro-benchmarks. ``--quick``: the first row of
each table only.

Every source is out of sample: no constant of the cost model is fitted on these rows (the
device constants come from micro-benchmarks, ``legato.devices``; a test removes and
perturbs these CSVs and checks none moves). So these figures are out of sample, and
``--ranking`` adds per group of alternative plans of one job (same model, GPUs, global
batch) Spearman's rank correlation and the pick regret, then their summary (goals:
Spearman >= 0.9, regret <= 5%). ``--out DIR`` gets a predicted vs measured plot per
source (PNG) and every row (JSON).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from legato.cost.published import (
    ASSUMPTIONS,
    Case,
    Result,
    errors_by_source,
    evaluate,
    load_cases,
)
from legato.cost.ranking import rank_groups, summary
from report import emit

BENCHMARK = "cost_model_accuracy"
GOAL_PCT = 10.0
GOAL_SPEARMAN = 0.9
GOAL_REGRET = 0.05


def _row_line(result: Result) -> None:
    case = result.case
    emit(
        BENCHMARK,
        case={
            "row_id": case.row["row_id"],
            "source": case.row["source"],
            "strategy": case.strategy.to_string(),
            "devices": case.cluster.world_size,
            "assumptions": case.family,
        },
        metric=f"{case.row['metric']} [{case.row['unit']}]",
        value=round(result.predicted, 4),
        baseline="published",
        baseline_value=case.published,
        ratio=round(result.ratio, 4),
    )


def _nccl_line() -> None:
    """The A100 intra-node collective law's fit (from the micro-benchmarks, not these rows)."""
    from legato.devices.registry import shipped_profile

    law = shipped_profile("a100-80g").collectives["intra_node"]
    emit(BENCHMARK, case={"source": "device profile a100-80g, collectives.intra_node"},
         metric="held_out_abs_pct_error", value=law.fit.held_out_median_pct,
         mean_abs_pct_error=law.fit.held_out_mean_pct, bus_fraction=law.bus_fraction,
         call_latency_us=law.call_latency_us)  # fmt: skip


def _accepted_cases() -> list[Case]:
    """Every calibration row the cost model accepts; a line per row it rejects (goal: none)."""
    cases, rejected = load_cases()
    for r in rejected:
        emit(BENCHMARK, case={"row_id": r.row["row_id"], "source": r.row["source"]},
             metric="rejected", value=1, reason=r.reason)  # fmt: skip
    emit(BENCHMARK, case={"rows": len(cases) + len(rejected)}, metric="rejected_rows",
         value=len(rejected), goal=0, meets_goal=not rejected)  # fmt: skip
    return cases


def ranking(results: list[Result]) -> None:
    """Spearman and pick regret per group of alternative plans of one job, and summaries."""
    rankings = rank_groups(results)
    for g in rankings:
        emit(BENCHMARK, case={"source": g.key.source, "devices": g.key.devices,
                              "gbs": g.key.gbs, "model_shape": list(g.key.shape),
                              "plans": g.plans},
             metric="spearman", value=None if g.spearman is None else round(g.spearman, 4),
             pick_regret=round(g.regret, 4), predicted_best=g.predicted_best,
             measured_best=g.measured_best)  # fmt: skip
    families = dict.fromkeys(r.case.family for r in results)
    by_family = {f: [g for g in rankings if g.key.source == f] for f in families}
    for name, groups in [*by_family.items(), ("all", rankings)]:
        if not groups:
            continue
        stats = {k: round(v, 4) for k, v in summary(groups).items()}
        emit(BENCHMARK, case={"source": name}, metric="ranking_summary",
             value=stats.get("spearman_median"), **stats,
             goals={"spearman_median": GOAL_SPEARMAN, "regret_max": GOAL_REGRET})  # fmt: skip


def _plot(held: list[Result], out: Path) -> None:
    """Predicted over measured (both in the row's own metric), one panel per source."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    families = list(dict.fromkeys(r.case.family for r in held))
    columns = 4
    rows = -(-len(families) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(3.4 * columns, 2.9 * rows), squeeze=False)
    for ax, family in zip(axes.flat, families, strict=False):
        mine = [r for r in held if r.case.family == family]
        ax.scatter([r.case.published for r in mine], [r.ratio for r in mine], s=6, alpha=0.5)
        ax.axhline(1.0, color="C3", lw=0.8)
        for bound in (0.9, 1.1):
            ax.axhline(bound, color="C3", lw=0.8, ls=":")
        measured = [r.case.published for r in mine]
        if max(measured) > 10 * min(measured):  # log only where it spans decades
            ax.set_xscale("log")
        ax.set_title(f"{family} ({len(mine)} rows)", fontsize=9)
        ax.set_xlabel(f"measured {mine[0].case.row['unit']}", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in axes.flat[len(families) :]:
        ax.axis("off")
    for ax in axes[:, 0]:
        ax.set_ylabel("predicted / measured", fontsize=8)
    fig.suptitle("Cost model, no constant fitted on these rows (dotted: +-10%)", fontsize=10)
    fig.tight_layout()
    fig.savefig(out / "cost_model_accuracy.png", dpi=120)
    plt.close(fig)
    points = [{"row_id": r.case.row["row_id"], "source": r.case.row["source"],
               "measured": r.case.published, "predicted": r.predicted} for r in held]  # fmt: skip
    (out / "cost_model_accuracy.json").write_text(json.dumps(points, indent=1))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="first row of each table only")
    parser.add_argument("--ranking", action="store_true", help="ordering within plan groups")
    parser.add_argument("--out", type=Path, help="PNG and JSON of the predictions")
    args = parser.parse_args(argv)
    results = evaluate(cases=_accepted_cases())
    if args.quick:
        seen: set[str] = set()
        results = [
            r
            for r in results
            if not (r.case.row["source"] in seen or seen.add(r.case.row["source"]))
        ]
    for result in results:
        _row_line(result)
    for source, (mean, worst, rows) in errors_by_source(results).items():
        family = next(r.case.family for r in results if r.case.row["source"] == source)
        emit(
            BENCHMARK,
            case={"source": source, "rows": rows, "assumptions": ASSUMPTIONS[family]},
            metric="mean_abs_pct_error",
            value=round(100 * mean, 2),
            max_abs_pct_error=round(100 * worst, 2),
            goal=GOAL_PCT,
            meets_goal=100 * mean < GOAL_PCT,
        )
    _nccl_line()
    if args.ranking:
        ranking(results)
    if args.out is not None:
        _plot(results, args.out)


if __name__ == "__main__":
    main()
