"""``legato cluster``: pack training jobs onto shared devices.

* ``simulate``: replay a trace (Philly CSV format; default the bundled 2,000-job window)
  or a jobs TOML
  under one or more policies on a simulated cluster; a table, or ``--json`` (one object per
  policy), and ``--png`` for the JCT CDF and the device-occupancy timeline. Progress goes to
  stderr.
"""

from __future__ import annotations

import argparse
import json
import sys

from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from legato.cluster.jobs import ClusterShape, read_jobs_file
from legato.cluster.policies import POLICIES, make_policy
from legato.cluster.policies.gimbal import OBJECTIVES, Gimbal
from legato.cluster.report import metrics, render
from legato.cluster.simulator import RESTART_S, simulate
from legato.cluster.trace import default_trace, trace_jobs
from legato.cluster.workloads import DEFAULT_GPU, load_workloads
from legato.errors import ConfigError


def register(subparsers: argparse._SubParsersAction) -> None:
    group = subparsers.add_parser("cluster", help="pack training jobs onto shared devices")
    commands = group.add_subparsers(dest="cluster_command", metavar="SUBCOMMAND")
    commands.required = True
    sim = commands.add_parser("simulate", help="replay a job trace under packing policies")
    sim.add_argument("--trace", help="jobs in the Philly CSV format (default: bundled sample)")
    sim.add_argument(
        "--jobs-file",
        help="a jobs TOML ([cluster] and [[job]] tables) instead of a trace; sets the cluster",
    )
    sim.add_argument(
        "--policy",
        default="gimbal",
        help=f"one or more of {', '.join(POLICIES)}, comma-separated, or 'all' (default gimbal)",
    )
    sim.add_argument("--gpus", type=int, default=32, help="devices in the cluster (default 32)")
    sim.add_argument("--per-node", type=int, default=8, help="devices per node (default 8)")
    sim.add_argument("--jobs", type=int, default=300, help="consecutive trace rows (default 300)")
    sim.add_argument("--seed", type=int, default=0, help="trace window and job types (default 0)")
    sim.add_argument(
        "--load", type=float, default=1.0, help="arrival-rate multiplier: 2 = twice as fast"
    )
    sim.add_argument(
        "--objective", default="jct", choices=OBJECTIVES, help="Gimbal's objective (default jct)"
    )
    sim.add_argument(
        "--restart-s",
        type=float,
        default=RESTART_S,
        help=f"seconds a preempted or moved job loses (default {RESTART_S:g})",
    )
    sim.add_argument("--colocation", help="co-location table in Gavel's JSON shape")
    sim.add_argument("--profiles", help="folder of Pollux-style local-batch profiles")
    sim.add_argument(
        "--gpu", default=DEFAULT_GPU, help=f"device of the table (default {DEFAULT_GPU})"
    )
    sim.add_argument("--json", action="store_true", help="print JSON, one object per policy")
    sim.add_argument("--png", help="write the JCT CDF and occupancy timeline here")
    sim.set_defaults(func=_simulate)


def _policies(text: str, objective: str) -> list:
    names = list(POLICIES) if text == "all" else [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise ConfigError(f"--policy: choose one or more of {', '.join(POLICIES)}")
    return [Gimbal(objective=objective) if n == "gimbal" else make_policy(n) for n in names]


def _simulate(args: argparse.Namespace, _extra: list[str]) -> int:
    if args.restart_s < 0:
        raise ConfigError(f"--restart-s: must be >= 0, got {args.restart_s}")
    policies = _policies(args.policy, args.objective)
    workloads = load_workloads(args.colocation, args.profiles, args.gpu)
    if args.jobs_file:
        if args.trace:
            raise ConfigError("--jobs-file: give a jobs file or a --trace, not both")
        shape, jobs = read_jobs_file(args.jobs_file, workloads)
    else:
        shape = ClusterShape.of_gpus(args.gpus, args.per_node)
        jobs = trace_jobs(
            args.trace or default_trace(), workloads, args.jobs, args.seed, args.load, shape.devices
        )
    results = []
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        for policy in policies:
            task = bar.add_task(f"{policy.name:>9}", total=len(jobs))
            results.append(
                simulate(
                    jobs,
                    shape,
                    workloads,
                    policy,
                    args.restart_s,
                    progress=lambda done, _total, task=task: bar.update(task, completed=done),
                )
            )
    rows = [metrics(r) for r in results]
    if args.png:
        render(results, args.png)
    if args.json:
        out = rows[0] if len(rows) == 1 else rows
        print(json.dumps(out, indent=2))
        return 0
    title = f"{len(jobs)} jobs on {shape.devices} devices"
    table = Table(box=box.SIMPLE, title=title if args.jobs_file else f"{title}, load {args.load:g}")
    for column in (
        "policy",
        "mean JCT h",
        "p99 JCT h",
        "queueing h",
        "makespan h",
        "util",
        "deadlines",
    ):
        table.add_column(column, justify="left" if column == "policy" else "right")
    for row in rows:
        met = row["deadlines_met"]
        table.add_row(
            row["policy"],
            f"{row['mean_jct_s'] / 3600:.2f}",
            f"{row['p99_jct_s'] / 3600:.2f}",
            f"{row['mean_queueing_s'] / 3600:.2f}",
            f"{row['makespan_s'] / 3600:.2f}",
            f"{row['utilization']:.0%}",
            "-" if met is None else f"{met:.0%}",
        )
    Console(file=sys.stdout).print(table)
    if args.png:
        print(f"wrote {args.png}")
    return 0
