"""Cost model accuracy: predicted vs published for every run in published_runs.csv.

Each row of ``legato/cost/data/published_runs.csv`` (Megatron-LM SC'21 Table 1,
Korthikanti et al. Tables 3/5 and text, MT-NLG, Llama 3 Table 4, torchtitan) becomes a
(model, cluster, strategy) triple; ``legato.cost.training_step`` predicts its step and the
prediction is converted into the row's own metric with the source's own FLOP formula
(``legato.cost.published``, whose ``ASSUMPTIONS`` list how each source's gaps are
filled). One global set of constants (``legato.cost.calibration``) serves every row.

Output, one JSON object per line: per row ``value`` (predicted) vs ``baseline_value``
(published) with ``ratio = value / baseline_value`` (1 is perfect; for iteration time
above 1 means predicted slower, for throughput metrics predicted faster); then per source
table ``mean_abs_pct_error`` and ``max_abs_pct_error`` (lower is better, goal < 10); then
the collective model's fit to the measured NCCL all-reduce. ``--quick``: the first row of
each table only.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import legato.cost
from legato.cost.published import ASSUMPTIONS, Result, errors_by_source, evaluate
from legato.specs import Link
from report import emit

BENCHMARK = "cost_model_accuracy"
GOAL_PCT = 10.0


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
    from legato.cost.link_fit import fit_collective_model
    from legato.cost.nccl import read_nccl_tests

    data = Path(legato.cost.__file__).parent / "data"
    nvlink = Link("NVLink 3", bandwidth_gbps=300, latency_us=2.0)
    measured = [
        m for p in (2, 4, 8) for m in read_nccl_tests(data / f"a100_nccl_allreduce_{p}gpu.txt", p)
    ]
    fit = fit_collective_model(measured, nvlink.latency_us, nvlink.bandwidth_gbps)
    emit(
        BENCHMARK,
        case={"source": "a100_nccl_allreduce_{2,4,8}gpu.txt", "sizes": len(measured)},
        metric="mean_abs_pct_error",
        value=round(100 * fit.mean_error, 2),
        p95_abs_pct_error=round(100 * fit.p95_error, 2),
        max_abs_pct_error=round(100 * fit.max_error, 2),
        base_latency_us=round(fit.base_latency_us, 2),
        bandwidth_fraction=round(fit.bandwidth_fraction, 4),
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="first row of each table only")
    args = parser.parse_args(argv)
    results = evaluate()
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


if __name__ == "__main__":
    main()
