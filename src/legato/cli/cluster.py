"""``legato cluster``: pack training jobs onto shared devices.

* ``simulate``: replay a trace (Philly CSV format; default the bundled 2,000-job window)
  or a jobs TOML under one or more policies on a simulated cluster; a table, or ``--json``
  (one object per policy), and ``--png`` for the JCT CDF and the device-occupancy timeline.
* ``profile``: measure the job types of a jobs TOML on this host (co-location table,
  local-batch curves, start-up time) for ``simulate --profile`` and ``run``.
* ``run``: run the jobs of a jobs TOML as legato trainers on Ray under one policy, and set
  the measured JCTs beside the simulator's prediction from the profile.

Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from legato.atomic import write_text_atomic
from legato.cluster.jobs import ClusterShape, read_jobs_and_types, read_jobs_file
from legato.cluster.policies import POLICIES, make_policy
from legato.cluster.policies.gimbal import OBJECTIVES, Gimbal
from legato.cluster.profile import read_profile
from legato.cluster.report import metrics, render, run_report
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
    sim.add_argument(
        "--profile", help="a `legato cluster profile` folder (sets the table, profiles, start-up)"
    )
    sim.add_argument("--colocation", help="co-location table in Gavel's JSON shape")
    sim.add_argument("--profiles", help="folder of Pollux-style local-batch profiles")
    sim.add_argument(
        "--gpu", default=DEFAULT_GPU, help=f"device of the table (default {DEFAULT_GPU})"
    )
    sim.add_argument("--json", action="store_true", help="print JSON, one object per policy")
    sim.add_argument("--png", help="write the JCT CDF and occupancy timeline here")
    sim.set_defaults(func=_simulate)

    prof = commands.add_parser("profile", help="measure legato job types on this host")
    prof.add_argument("jobs_file", help="a jobs TOML with [type.NAME] tables")
    prof.add_argument(
        "--out", default="cluster_profile", help="folder to write (default cluster_profile)"
    )
    prof.add_argument(
        "--window-s", type=float, default=6.0, help="seconds each rate is measured over (default 6)"
    )
    prof.add_argument(
        "--cores-per-device", type=int, default=1, help="CPU cores of one device (default 1)"
    )
    prof.set_defaults(func=_profile)

    run = commands.add_parser("run", help="run a jobs TOML as legato trainers on Ray")
    run.add_argument("jobs_file", help="a jobs TOML with [type.NAME] tables")
    run.add_argument("--policy", default="gimbal", help=f"one of {', '.join(POLICIES)}")
    run.add_argument(
        "--objective", default="jct", choices=OBJECTIVES, help="Gimbal's objective (default jct)"
    )
    run.add_argument("--profile", required=True, help="the `legato cluster profile` folder")
    run.add_argument(
        "--out", default="cluster_run", help="folder for the jobs' runs (default cluster_run)"
    )
    run.add_argument("--address", help="a Ray cluster to join (default: start one locally)")
    run.add_argument("--json", action="store_true", help="print the result as JSON")
    run.add_argument("--png", help="write the JCT CDF and occupancy timeline here")
    run.set_defaults(func=_run)


def _policies(text: str, objective: str) -> list:
    names = list(POLICIES) if text == "all" else [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise ConfigError(f"--policy: choose one or more of {', '.join(POLICIES)}")
    return [Gimbal(objective=objective) if n == "gimbal" else make_policy(n) for n in names]


def _simulate(args: argparse.Namespace, _extra: list[str]) -> int:
    if args.restart_s < 0:
        raise ConfigError(f"--restart-s: must be >= 0, got {args.restart_s}")
    policies = _policies(args.policy, args.objective)
    start_s = 0.0
    if args.profile:
        meta = read_profile(args.profile)
        args.colocation, args.profiles, args.gpu = (
            meta["colocation"],
            meta["profiles"],
            meta["device"],
        )
        start_s = args.restart_s = meta["startup_s"]
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
                    start_s=start_s,
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
    _print_table(rows, title if args.jobs_file else f"{title}, load {args.load:g}")
    if args.png:
        print(f"wrote {args.png}")
    return 0


_TIMES = {"mean JCT": "mean_jct_s", "p99 JCT": "p99_jct_s", "queueing": "mean_queueing_s",
          "makespan": "makespan_s"}  # fmt: skip


def _print_table(rows: list[dict], title: str) -> None:
    """The metrics table, times in hours (a trace) or seconds (runs of minutes)."""
    long = max(r["makespan_s"] for r in rows) >= 7200
    unit, scale, digits = ("h", 3600.0, 2) if long else ("s", 1.0, 1)
    table = Table(box=box.SIMPLE, title=title)
    for column in ("policy", *(f"{name} {unit}" for name in _TIMES), "util", "deadlines"):
        table.add_column(column, justify="left" if column == "policy" else "right")
    for row in rows:
        met = row["deadlines_met"]
        table.add_row(
            row["policy"],
            *(f"{row[key] / scale:.{digits}f}" for key in _TIMES.values()),
            f"{row['utilization']:.0%}",
            "-" if met is None else f"{met:.0%}",
        )
    Console(file=sys.stdout).print(table)


def _legato_jobs(path: str, workloads) -> tuple:
    shape, jobs, types = read_jobs_and_types(path, workloads)
    if not types:
        raise ConfigError(f"{path}: no [type.NAME] tables; `cluster run` runs legato job types")
    for job in jobs:
        if job.job_type not in {t.key for t in types.values()}:
            raise ConfigError(
                f"{path}: job {job.name!r}: type must be one of the file's types "
                f"({', '.join(types)})"
            )
    return shape, jobs, types


def _profile(args: argparse.Namespace, _extra: list[str]) -> int:
    from legato.cluster.profile import profile
    from legato.cluster.ray_jobs import ray_session

    if args.window_s <= 0:
        raise ConfigError(f"--window-s: must be > 0, got {args.window_s}")
    if args.cores_per_device < 1:
        raise ConfigError(f"--cores-per-device: must be >= 1, got {args.cores_per_device}")
    shape, _, types = _legato_jobs(args.jobs_file, None)
    devices = min(shape.devices, 2)
    err = Console(stderr=True)
    with ray_session(devices, args.cores_per_device, None):
        meta = profile(types, devices, args.out, args.window_s, args.cores_per_device, err.print)
    print(f"wrote {args.out}/colocation.json, {args.out}/profiles/, {args.out}/profile.json "
          f"(start-up {meta['startup_s']:.1f} s)")  # fmt: skip
    return 0


def _run(args: argparse.Namespace, _extra: list[str]) -> int:
    from legato.cluster.executor import Executor
    from legato.cluster.ray_jobs import ray_session

    if "," in args.policy or args.policy == "all":
        raise ConfigError("--policy: `cluster run` runs one policy at a time")
    policy = _policies(args.policy, args.objective)[0]
    meta = read_profile(args.profile)
    workloads = load_workloads(meta["colocation"], meta["profiles"], meta["device"])
    shape, jobs, types = _legato_jobs(args.jobs_file, workloads)
    cores = meta["cores_per_device"]
    err = Console(stderr=True)
    with ray_session(shape.devices, cores, args.address):
        executor = Executor(shape, jobs, types, workloads, policy, args.out, cores, err.print)
        ran = executor.run()
    predicted = simulate(jobs, shape, workloads, _policies(args.policy, args.objective)[0],
                         meta["startup_s"], start_s=meta["startup_s"])  # fmt: skip
    report = run_report(ran, predicted)
    write_text_atomic(Path(args.out) / "run.json", json.dumps(report, indent=2))
    if args.png:
        render([ran.result, predicted], args.png, ["measured", "simulated"])
    if args.json:
        print(json.dumps(report, indent=2))
        return 1 if ran.failures else 0
    rows = [report["measured"], report["predicted"]]
    rows[0]["policy"], rows[1]["policy"] = f"{policy.name} (run)", f"{policy.name} (simulated)"
    _print_table(rows, f"{len(jobs)} legato jobs on {shape.devices} devices")
    print(
        f"measured / simulated mean JCT: {report['mean_jct_ratio']:.2f}; shares: {ran.share_mode}"
    )
    for name, error in ran.failures.items():
        print(f"job {name} failed: {error}")
    return 1 if ran.failures else 0
