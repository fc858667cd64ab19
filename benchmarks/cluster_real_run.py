"""Cluster packing for real: a mix of tiny legato jobs run on this host under Gimbal and FIFO,
each run set beside the simulator's prediction of the same mix.

The job types of ``--jobs-file`` (default ``examples/cluster_run.toml``: five jobs of two
sizes, one and two workers, arriving over two minutes, on two one-core devices) are first
profiled (``legato cluster profile``; or ``--profile`` reuses a folder). Then each policy
runs the mix ``--repeats`` times as Ray actors (``legato cluster run``), and the simulator
replays the same jobs from the profile with the same policy. Rows, medians over repeats:

- each policy's measured mean JCT against its simulated one (ratio measured / simulated;
  the goal is within 15%), with every job's two JCTs in ``extra``;
- Gimbal's measured mean JCT against FIFO's (ratio FIFO / Gimbal, > 1: Gimbal better), and
  the same ratio as the simulator predicts it.

    python benchmarks/cluster_real_run.py [--repeats 2] [--profile DIR] [--png FILE]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from legato.cluster.executor import Executor
from legato.cluster.jobs import read_jobs_and_types
from legato.cluster.policies import make_policy
from legato.cluster.profile import profile, read_profile
from legato.cluster.ray_jobs import ray_session
from legato.cluster.report import render, run_report
from legato.cluster.simulator import simulate
from legato.cluster.workloads import load_workloads
from report import emit, note

BENCHMARK = "cluster_real_run"
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "cluster_run.toml"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs-file", type=Path, default=EXAMPLE)
    parser.add_argument("--profile", type=Path, help="reuse a `legato cluster profile` folder")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--policies", default="fifo,gimbal")
    parser.add_argument("--window-s", type=float, default=6.0, help="profile window")
    parser.add_argument("--png", type=Path, help="measured and simulated runs of the last repeat")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="legato-real-run-"))
    shape, _, types = read_jobs_and_types(args.jobs_file, None)
    with ray_session(shape.devices, 1):
        _benchmark(args, work, shape, types)


def _benchmark(args: argparse.Namespace, work: Path, shape, types) -> None:
    if args.profile is None:
        args.profile = work / "profile"
        profile(types, min(shape.devices, 2), args.profile, args.window_s, say=print)
    meta = read_profile(args.profile)
    workloads = load_workloads(meta["colocation"], meta["profiles"], meta["device"])
    shape, jobs, types = read_jobs_and_types(args.jobs_file, workloads)
    note(BENCHMARK, jobs_file=str(args.jobs_file), devices=shape.devices, jobs=len(jobs),
         repeats=args.repeats, startup_s=meta["startup_s"], profile=str(args.profile))  # fmt: skip
    names = [n.strip() for n in args.policies.split(",")]
    measured: dict[str, list[float]] = {n: [] for n in names}
    simulated: dict[str, float] = {}
    last = {}
    for repeat in range(args.repeats):
        for name in names:
            out = work / f"{name}-{repeat}"
            ran = Executor(shape, jobs, types, workloads, make_policy(name), out,
                           meta["cores_per_device"], say=lambda _: None).run()  # fmt: skip
            predicted = simulate(jobs, shape, workloads, make_policy(name), meta["startup_s"],
                                 start_s=meta["startup_s"])  # fmt: skip
            report = run_report(ran, predicted)
            if ran.failures:
                note(BENCHMARK, policy=name, repeat=repeat, failures=ran.failures)
                continue
            measured[name].append(report["measured"]["mean_jct_s"])
            simulated[name] = report["predicted"]["mean_jct_s"]
            last[name] = (ran.result, predicted, report)
            note(BENCHMARK, policy=name, repeat=repeat, mean_jct_s=report["measured"]["mean_jct_s"],
                 jobs=report["jobs"], share_mode=report["share_mode"])  # fmt: skip
    case = {"jobs_file": args.jobs_file.name, "devices": shape.devices, "repeats": args.repeats}
    for name in names:
        if not measured[name]:
            continue
        emit(BENCHMARK, {**case, "policy": name}, "mean_jct_s", statistics.median(measured[name]),
             "simulated", simulated[name], digits=2, ratio_digits=3,
             per_repeat=measured[name], jobs=last[name][2]["jobs"])  # fmt: skip
    if "gimbal" in measured and "fifo" in measured and measured["gimbal"] and measured["fifo"]:
        fifo, gimbal = statistics.median(measured["fifo"]), statistics.median(measured["gimbal"])
        emit(BENCHMARK, case, "mean_jct_s_fifo_over_gimbal", fifo / gimbal, "simulated",
             simulated["fifo"] / simulated["gimbal"], digits=3, ratio_digits=3)  # fmt: skip
    if args.png and last:
        results, labels = [], []
        for name, (real, predicted, _) in last.items():
            results += [real, predicted]
            labels += [f"{name} (run)", f"{name} (simulated)"]
        render(results, args.png, labels)


if __name__ == "__main__":
    main()
