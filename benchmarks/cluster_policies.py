"""Cluster packing: Gimbal against FIFO, Tiresias, Gandiva, Gavel and Lucid on the Philly trace.

Each case is a window of ``--jobs`` consecutive Philly jobs (a seeded random start, job
types drawn from Gavel's V100 table) on a ``--gpus`` cluster of 8-device nodes, at several
arrival-rate multipliers (``--loads``). Every policy replays the same jobs. Rows (one JSON
line each), medians over the seeds per load:

- ``mean_jct_s`` of Gimbal (JCT objective) against Lucid, ``mean_queueing_s`` against
  Lucid, ``makespan_s`` of Gimbal with the makespan objective against Gavel, the share of
  deadlines met by Gimbal with the deadline objective against Gandiva; every policy's
  metrics in ``extra``;
- the ablation: unequal packing alone, + sample stealing, + resource restriction, each
  against Lucid (the paper's 1.05x / 1.18x / 1.28x);
- the early-stopped search (3 trials without gain) against the full search: the share of
  the full search's JCT gain over FIFO it keeps, and the trials each ran.

Ratios are of the medians over seeds, baseline / Gimbal for times and Gimbal / baseline
for deadlines met (> 1: Gimbal better); each seed's own ratio is in ``per_seed_ratios``. ``--png`` writes the JCT CDF and occupancy timeline of one case.

    python benchmarks/cluster_policies.py [--quick] [--trace ../shared/data/cluster/philly_jobs.csv]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from legato.cluster.jobs import ClusterShape
from legato.cluster.policies import make_policy
from legato.cluster.policies.gimbal import Gimbal
from legato.cluster.report import metrics, render
from legato.cluster.simulator import simulate
from legato.cluster.trace import default_trace, trace_jobs
from legato.cluster.workloads import load_workloads
from legato.errors import DataError
from report import emit, note

BENCHMARK = "cluster_policies"
SHARED_TRACE = (
    Path(__file__).resolve().parents[2] / "shared" / "data" / "cluster" / "philly_jobs.csv"
)
BASELINES = ("fifo", "tiresias", "gandiva", "gavel", "lucid")
VARIANTS = {  # name -> the Gimbal configuration
    "gimbal": dict(),
    "gimbal-makespan": dict(objective="makespan"),
    "gimbal-deadline": dict(objective="deadline"),
    "unequal-only": dict(stealing=False, restriction=False),
    "unequal+stealing": dict(restriction=False),
    "gimbal-full-search": dict(patience=None),
}


def _policy(name: str):
    return Gimbal(name=name, **VARIANTS[name]) if name in VARIANTS else make_policy(name)


def run_case(trace: Path, workloads, shape: ClusterShape, jobs: int, seed: int, load: float):
    """Every policy on one window: {policy: (metrics, result, trials)}."""
    window = trace_jobs(trace, workloads, jobs, seed, load, shape.devices)
    out = {}
    for name in (*BASELINES, *VARIANTS):
        policy = _policy(name)
        began = time.perf_counter()
        result = simulate(window, shape, workloads, policy)
        row = metrics(result) | {"wall_s": time.perf_counter() - began}
        out[name] = (row, result, getattr(policy, "trials", None))
    return out


def _median(cases: list[dict], name: str, key: str) -> float | None:
    values = [c[name][0][key] for c in cases if c[name][0][key] is not None]
    return statistics.median(values) if values else None


def report_load(cases: list[dict], case: dict) -> None:
    def ratio_row(metric: str, ours: str, baseline: str, higher_better: bool = False):
        mine, theirs = _median(cases, ours, metric), _median(cases, baseline, metric)
        per_seed = [
            round(c[ours][0][metric] / c[baseline][0][metric], 3)
            if higher_better
            else round(c[baseline][0][metric] / c[ours][0][metric], 3)
            for c in cases
            if c[ours][0][metric] and c[baseline][0][metric]
        ]
        ratio = (mine / theirs if higher_better else theirs / mine) if mine and theirs else None
        emit(
            BENCHMARK, case | {"policy": ours}, metric, mine, baseline, theirs,
            ratio=ratio, digits=3, ratio_digits=3, per_seed_ratios=per_seed,
            ratio_meaning=(
                f"{'gimbal/baseline' if higher_better else 'baseline/gimbal'} of the medians "
                "over seeds (> 1: Gimbal better)"
            ),
        )  # fmt: skip

    ratio_row("mean_jct_s", "gimbal", "lucid")
    ratio_row("mean_queueing_s", "gimbal", "lucid")
    ratio_row("p99_jct_s", "gimbal", "lucid")
    ratio_row("makespan_s", "gimbal-makespan", "gavel")
    ratio_row("deadlines_met", "gimbal-deadline", "gandiva", higher_better=True)
    for variant in ("unequal-only", "unequal+stealing", "gimbal"):
        ratio_row("mean_jct_s", variant, "lucid")
    kept = []
    for c in cases:
        fifo = c["fifo"][0]["mean_jct_s"]
        full = fifo - c["gimbal-full-search"][0]["mean_jct_s"]
        early = fifo - c["gimbal"][0]["mean_jct_s"]
        if full > 0:
            kept.append(early / full)
    trials = [c["gimbal"][2] / max(c["gimbal-full-search"][2], 1) for c in cases]
    emit(
        BENCHMARK, case | {"policy": "gimbal"}, "share_of_full_search_gain",
        statistics.median(kept) if kept else None, digits=4,
        trials_over_full_search=statistics.median(trials),
    )  # fmt: skip
    table = {
        name: {k: _median(cases, name, k) for k in ("mean_jct_s", "p99_jct_s", "mean_queueing_s",
               "makespan_s", "utilization", "deadlines_met", "wall_s")}
        for name in cases[0]
    }  # fmt: skip
    note(BENCHMARK, case=case, medians=table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, help="Philly CSV (default: shared/, else bundled)")
    parser.add_argument("--gpus", type=int, default=32)
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--loads", default="1,2,4")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="one load, two seeds, 120 jobs")
    parser.add_argument("--png", type=Path, help="JCT CDF + occupancy of the first case")
    args = parser.parse_args()
    trace = args.trace or (SHARED_TRACE if SHARED_TRACE.is_file() else default_trace())
    loads = [2.0] if args.quick else [float(x) for x in args.loads.split(",")]
    seeds, jobs = (2, 120) if args.quick else (args.seeds, args.jobs)
    workloads = load_workloads()
    shape = ClusterShape.of_gpus(args.gpus)
    note(BENCHMARK, trace=str(trace), gpus=shape.devices, jobs=jobs, seeds=seeds, loads=loads)
    for load in loads:
        cases, seed = [], 0
        while len(cases) < seeds and seed < 10 * seeds:
            try:
                cases.append(run_case(trace, workloads, shape, jobs, seed, load))
            except DataError as exc:  # a window with a job larger than the cluster
                note(BENCHMARK, skipped_seed=seed, load=load, reason=str(exc))
            seed += 1
        if args.png and load == loads[0]:
            picked = ("fifo", "gavel", "lucid", "gimbal")
            render([cases[0][n][1] for n in picked], args.png)
        report_load(cases, {"trace": trace.name, "gpus": shape.devices, "jobs": jobs, "load": load})


if __name__ == "__main__":
    main()
