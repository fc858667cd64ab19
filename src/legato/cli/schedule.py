"""``legato schedule``: build, check and simulate pipeline schedules; bubble/memory front.

* ``simulate``: build one schedule, print bubble ratio, peak activation and makespan
  (table, or ``--json``), optionally write a Chrome trace, a PNG timeline and the
  schedule itself as JSON (``--save``, the input of the runtime);
* ``pareto``: sweep schedules x slices x memory caps for one (p, m) and write the
  bubble/memory scatter with its Pareto front (PNG and JSON);
* ``check``: validate a schedule JSON file (dependencies, transfers, deadlock).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich import box
from rich.console import Console
from rich.table import Table

from legato.atomic import naming, write_text_atomic
from legato.schedule import (
    SCHEDULES,
    CostModel,
    Schedule,
    ScheduleError,
    build_schedule,
    render_pareto_png,
    render_timeline_png,
    simulate,
    sweep,
    validate,
    write_chrome_trace,
    write_pareto_json,
)
from legato.specs.schedules import SCHEDULE_KINDS
from legato.specs.typed import read_table_file

_COST_HELP = (
    "cost model as name=value pairs: f, b, w (time of forward, input-gradient and "
    "weight-gradient backward of one micro-batch on one rank; default 1 each), attn "
    "(causal-attention share of F/B time), latency, bandwidth, msg_bytes (P2P), act_bytes "
    "(activations of one micro-batch on one rank, to report bytes)"
)


def register(subparsers: argparse._SubParsersAction) -> None:
    group = subparsers.add_parser("schedule", help="build, check and simulate pipeline schedules")
    commands = group.add_subparsers(dest="schedule_command", metavar="SUBCOMMAND")
    commands.required = True

    sim = commands.add_parser("simulate", help="simulate one schedule: bubble, memory, timeline")
    sim.add_argument("--schedule", required=True, choices=SCHEDULES)
    sim.add_argument("--stages", type=int, required=True, help="pipeline ranks p")
    sim.add_argument("--microbatches", type=int, required=True, help="micro-batches m")
    sim.add_argument("--chunks", type=int, help="model chunks per rank v (interleaved, svpp)")
    sim.add_argument("--slices", type=int, help="sequence slices k (seq1f1b, svpp)")
    sim.add_argument("--memory-cap", type=float, help="in-flight slice units per rank (svpp, zb-v)")
    sim.add_argument(
        "--w-subtasks", type=int, help="split each W into G tasks (zb-h1, zb-2p, zb-v, svpp)"
    )
    sim.add_argument("--slicing", choices=("equal-length", "equal-flops"))
    sim.add_argument("--cost", default="", help=_COST_HELP)
    sim.add_argument("--json", action="store_true", help="print JSON instead of a table")
    sim.add_argument("--png", type=Path, help="write a PNG timeline")
    sim.add_argument("--trace", type=Path, help="write a Chrome trace (chrome://tracing, Perfetto)")
    sim.add_argument("--save", type=Path, help="write the schedule (per-rank actions) as JSON")
    sim.set_defaults(func=_run_simulate)

    pareto = commands.add_parser("pareto", help="bubble/memory Pareto front over schedules")
    pareto.add_argument("--stages", type=int, required=True)
    pareto.add_argument("--microbatches", type=int, required=True)
    pareto.add_argument("--chunks", default="1,2", help="chunk counts for svpp (default 1,2)")
    pareto.add_argument("--slices", default="1,2,4,8", help="slice counts (default 1,2,4,8)")
    pareto.add_argument("--cost", default="", help=_COST_HELP)
    pareto.add_argument("--png", type=Path, help="write the scatter with the front")
    pareto.add_argument("--json", type=Path, help="write all points and the front as JSON")
    pareto.set_defaults(func=_run_pareto)

    chk = commands.add_parser("check", help="validate a schedule JSON file")
    chk.add_argument("file", type=Path)
    chk.set_defaults(func=_run_check)


def _ints(text: str, field: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ScheduleError(f"{field}: expected comma-separated integers, got {text!r}") from None


def _wrote(what: str, path: Path, stderr: bool = False) -> None:
    """Say where a file went (on stderr when stdout is a JSON document)."""
    print(f"wrote {what}: {path}", file=sys.stderr if stderr else sys.stdout)


def _run_simulate(args: argparse.Namespace, extra: list[str]) -> int:
    costs = CostModel.parse(args.cost)
    options = {
        "chunks": args.chunks, "slices": args.slices, "memory_cap": args.memory_cap,
        "w_subtasks": args.w_subtasks, "slicing": args.slicing,
    }  # fmt: skip
    if SCHEDULE_KINDS[args.schedule].cost_driven:
        options["costs"] = costs
    s = build_schedule(args.schedule, stages=args.stages, microbatches=args.microbatches, **options)
    result = simulate(s, costs)
    if args.save:
        with naming("--save"):
            write_text_atomic(args.save, s.to_json())
        _wrote("schedule", args.save, args.json)
    if args.trace:
        with naming("--trace"):
            write_chrome_trace(result, args.trace)
        _wrote("Chrome trace", args.trace, args.json)
    if args.png:
        with naming("--png"):
            render_timeline_png(result, args.png)
        _wrote("timeline PNG", args.png, args.json)
    if args.json:
        print(json.dumps({**result.to_dict(), "slice_bounds": list(s.slice_bounds)}, indent=1))
        return 0
    table = Table(box=box.SIMPLE, title=(
        f"{s.name}: p={s.stages} m={s.microbatches} v={s.chunks} k={s.slices}, "
        f"{s.backward} backward, makespan {result.makespan:.4g}"
    ))  # fmt: skip
    for column in ("rank", "busy", "bubble", "vs ideal", "peak units", "peak / 1F1B"):
        table.add_column(column, justify="right")
    for d in range(s.stages):
        table.add_row(
            str(d), f"{result.busy[d]:.4g}", f"{result.bubble_ratio[d]:.2%}",
            f"{result.bubble_vs_ideal[d]:.2%}", f"{result.peak_units[d]:.4g}",
            f"{result.peak_fraction[d]:.3f}",
        )  # fmt: skip
    console = Console()
    console.print(table)
    console.print(
        f"bubble (idle/makespan) max {max(result.bubble_ratio):.2%}; peak activation max "
        f"{max(result.peak_fraction):.3f} of 1F1B's stage-0 peak (p micro-batches)"
    )
    return 0


def _run_pareto(args: argparse.Namespace, extra: list[str]) -> int:
    costs = CostModel.parse(args.cost)
    chunks, slices = _ints(args.chunks, "chunks"), _ints(args.slices, "slices")
    points = sweep(args.stages, args.microbatches, chunks=chunks, slices=slices, costs=costs)
    title = f"p={args.stages} m={args.microbatches}: bubble vs peak activation"
    if args.json:
        with naming("--json"):
            write_pareto_json(points, args.json, stages=args.stages,
                              microbatches=args.microbatches, cost=args.cost)  # fmt: skip
        _wrote("points and front JSON", args.json)
    if args.png:
        with naming("--png"):
            render_pareto_png(points, args.png, title)
        _wrote("Pareto PNG", args.png)
    table = Table(box=box.SIMPLE, title=title + " (* = on the Pareto front)")
    for column in ("", "schedule", "peak / 1F1B", "bubble", "makespan"):
        table.add_column(column, justify="left" if column == "schedule" else "right")
    for pt in sorted(points, key=lambda q: (q.peak, q.bubble)):
        table.add_row("*" if pt.on_front else "", pt.label, f"{pt.peak:.3f}",
                      f"{pt.bubble:.2%}", f"{pt.makespan:.4g}")  # fmt: skip
    Console().print(table)
    return 0


def _run_check(args: argparse.Namespace, extra: list[str]) -> int:
    s = Schedule.from_dict(read_table_file(args.file, ScheduleError))
    problems = validate(s)
    for problem in problems:
        print(problem)
    if problems:
        print(f"{args.file}: {len(problems)} problem(s)")
        return 1
    print(f"{args.file}: ok ({sum(len(r) for r in s.ranks)} actions on {s.stages} ranks)")
    return 0
