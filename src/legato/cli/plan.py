"""``legato predict`` and ``legato plan``: the cost model and the planner on the command line.

Neither command imports torch. Models and clusters are a preset name, a TOML/JSON file or
(in ``--batch`` lines) an inline table; strategies use the ``key=value`` syntax of
``Strategy.parse`` (``dp=32,tp=4x2,pp=4,vpp=2,schedule=interleaved,mbs=1,gbs=512``).
User mistakes (unknown preset, impossible strategy) are one line on stderr, exit code 2.
The cost model's constants are ``CALIBRATION``'s, those of ``--calibration FILE``, or, for
a cluster file written by ``legato calibrate``, those of its ``<stem>.calibration.json``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
from typing import Any

from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

from legato.cost.calibration import CALIBRATION, Calibration, calibration_beside, load_calibration
from legato.cost.runtime import Runtime, parse_runtime
from legato.errors import LegatoError
from legato.plan.report import PlanReport, make_plan
from legato.plan.search import Scorer
from legato.plan.space import DEFAULT_SCHEDULES, SEARCHED_SCHEDULES, SearchSpace
from legato.specs import ClusterSpec, ModelSpec, load_cluster, load_model
from legato.specs.strategy import DTYPES, Strategy, StrategyError

PREDICT_EPILOG = """\
output (--json): one JSON object with model, cluster, devices, strategy, step_time_s,
tokens_per_s, mfu, hfu, tflops_per_device, memory_gib, fits, why_not_fits and breakdown
(compute_s, bubble_s, exposed_comm_s and comm_s per mesh axis, memory_gib per term).
--batch FILE.jsonl: one JSON object per line, {"model": M, "cluster": C, "strategy": S,
"nodes": N, "seq": L, "runtime": R (the last three optional)}, M and C a preset name, a
file path or an inline table, S a strategy string or table, R a --runtime string or table
(default: --runtime's); prints one JSON line per input line in order
({"error": "..."} for a bad line) and exits 2 if any line failed. Blank lines are skipped."""

PLAN_EPILOG = """\
output (--json): {model, cluster, devices, gbs, seq_len, plans: [{strategy, step_time_s,
tokens_per_s, mfu, memory_gib, compute_s, bubble_s, exposed_comm_s, memory_by_term_gib,
layer_comm_bytes, techniques}], runner_up, baseline (the hand heuristic's plan, same
fields, or null), baseline_reason, gain_over_baseline (tokens/s ratio), search (counts,
elapsed_s)}. techniques: one line per device technique the plan uses (MoE overlap
schedule, activation swap, chunked loss, FP8). The search chooses the MoE overlap
schedule, and chunked loss and swap where nothing cheaper fits; precision is --dtype.
If no strategy fits, says which memory term is too big and exits 2."""


def _add_target(parser: argparse.ArgumentParser, required: bool) -> None:
    parser.add_argument("--model", required=required, help="model preset name or TOML/JSON file")
    parser.add_argument(
        "--cluster", required=required, help="cluster preset name or TOML/JSON file"
    )
    parser.add_argument("--nodes", type=int, default=None, help="number of nodes")
    parser.add_argument("--seq", type=int, default=None, help="sequence length (default: model's)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument(
        "--calibration",
        metavar="FILE",
        help="cost-model constants (JSON of Calibration fields, or a `legato calibrate` "
        "side file); default: for a cluster file written by `legato calibrate`, its "
        "<stem>.calibration.json when present, else the GPU-fitted constants",
    )
    parser.add_argument(
        "--runtime",
        metavar="KEY=VALUE,...",
        help="how the kernels and framework behave: profile=fsdp1|fsdp2|torchtitan|"
        "megatron-te|deepspeed-zero (a framework's documented behaviours, which the other "
        "keys override), flash_attention, dropout, "
        "fused_elementwise (0/1), grad_reduce_bytes (2 or 4: fp32 reductions, as FSDP "
        "mixed precision's default), loss_bytes (4: fp32 loss, 2: in bf16), "
        "tp_comm_overlap (0/1: comm-GEMM overlap), per_microbatch_sync (0/1: ZeRO-1/2 sync "
        "every micro-batch, as FSDP1 SHARD_GRAD_OP), host_link_gbps, bubble_speedup "
        "(>= 1: busy ranks run faster in the bubble, CPU hosts sharing cores); "
        "default: a current PyTorch stack (flash attention, no dropout, fused "
        "elementwise, reduce in the training dtype, fp32 loss)",
    )


def _calibration(path: str | None, cluster_src: Any) -> Calibration:
    """``--calibration FILE``, else the side file of a calibrated cluster file, else the
    GPU-fitted constants."""
    if path is not None:
        return load_calibration(path)
    found = calibration_beside(cluster_src) if isinstance(cluster_src, str) else None
    return found or CALIBRATION


def register(subparsers: argparse._SubParsersAction) -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    predict = subparsers.add_parser(
        "predict",
        help="predict step time, throughput, MFU and memory of one strategy",
        epilog=PREDICT_EPILOG,
        formatter_class=fmt,
    )
    _add_target(predict, required=False)
    predict.add_argument("--strategy", help="e.g. dp=8,tp=8,pp=2,sp=1,mbs=1,gbs=512")
    predict.add_argument("--batch", metavar="FILE.jsonl", help="predict every line of a file")
    predict.add_argument(
        "--explain",
        action="store_true",
        help="also print each term of the step (compute by op class, recompute, contention, "
        "exposed communication per axis, bubble, optimizer; they add up to the step), how "
        "each axis's collectives run and what each kind of traffic hid behind",
    )
    predict.add_argument(
        "--no-overlap",
        action="store_true",
        help="assume no communication/compute overlap (right for CPU processes over gloo, "
        "e.g. a `legato calibrate` cluster file)",
    )
    predict.set_defaults(func=_run_predict)

    plan = subparsers.add_parser(
        "plan",
        help="search the parallel space for the fastest strategies that fit",
        epilog=PLAN_EPILOG,
        formatter_class=fmt,
    )
    _add_target(plan, required=True)
    plan.add_argument("--gbs", type=int, required=True, help="global batch size (sequences)")
    plan.add_argument("--top", type=int, default=5, help="how many plans to show (default 5)")
    plan.add_argument(
        "--max-tp", type=int, default=None, help="largest TP degree (default: node/supernode)"
    )
    plan.add_argument("--no-2d", action="store_true", help="do not try 2-D tensor parallelism")
    plan.add_argument(
        "--schedules",
        default=",".join(DEFAULT_SCHEDULES),
        metavar="A,B,...",
        help=f"pipeline schedules to search, of {', '.join(SEARCHED_SCHEDULES)} (default: "
        f"all but dualpipe, which `legato train` does not run)",
    )
    plan.add_argument(
        "--dtype",
        choices=DTYPES,
        default="bf16",
        help="training precision of every plan (fp8: tile-wise FP8 block linears; default bf16)",
    )
    plan.add_argument(
        "--config",
        metavar="OUT.toml",
        help="also write a `legato train` config that runs the fastest plan the trainer "
        "executes (model, batch, dtype, parallel.strategy, nodes x nproc; parallel.cluster "
        "when --cluster is a file); for a plan over more than one host, also "
        "OUT.torchrun.sh, the torchrun command to run on every host",
    )
    plan.add_argument(
        "--config-rank",
        type=int,
        metavar="K",
        help="with --config: write the K-th ranked plan (1 = the fastest) instead, or fail "
        "with the reason `legato train` cannot run it",
    )
    plan.set_defaults(func=_run_plan)


def _load(model_src: Any, cluster_src: Any, nodes: int | None, seq: int | None):
    model = load_model(model_src)
    if seq is not None:
        model = model.with_(seq_len=seq)
    return model, load_cluster(cluster_src, nodes=nodes)


def _strategy(source: Any) -> Strategy:
    if isinstance(source, Strategy):
        return source
    if isinstance(source, dict):
        items = [f"{k}={int(v) if isinstance(v, bool) else v}" for k, v in source.items()]
        return Strategy.parse(",".join(items))
    if isinstance(source, str):
        return Strategy.parse(source)
    raise StrategyError(f"strategy must be a string or a table, got {type(source).__name__}")


def predict_one(
    model: ModelSpec,
    cluster: ClusterSpec,
    strategy: Strategy,
    overlap: bool = True,
    calibration: Calibration = CALIBRATION,
    runtime: Runtime | None = None,
) -> dict[str, Any]:
    """The JSON object ``legato predict`` prints for one triple."""
    from legato.cost.training_step import predict

    strategy.check(model, cluster.world_size)
    prediction = predict(
        model, cluster, strategy, overlap=overlap, calibration=calibration, runtime=runtime
    )
    head = {"model": model.name, "cluster": cluster.name, "devices": cluster.world_size}
    return {**head, "strategy": strategy.to_string(), **prediction.to_dict()}


def _run_predict(args: argparse.Namespace, extra: list[str]) -> int:
    overlap = not args.no_overlap
    runtime = parse_runtime(args.runtime, "--runtime")
    if args.batch:
        return _run_batch(args.batch, overlap, args.calibration, runtime)
    missing = [f"--{n}" for n in ("model", "cluster", "strategy") if getattr(args, n) is None]
    if missing:
        raise LegatoError(f"predict needs {', '.join(missing)} (or --batch FILE.jsonl)")
    model, cluster = _load(args.model, args.cluster, args.nodes, args.seq)
    calibration = _calibration(args.calibration, args.cluster)
    result = predict_one(model, cluster, _strategy(args.strategy), overlap, calibration, runtime)
    if args.json:
        print(json.dumps(result))
    else:
        _console().print(_prediction_table(result))
        if args.explain:
            _console().print(_explain_table(result["breakdown"], result["step_time_s"]))
    return 0


def _batch_line(
    line: str, overlap: bool, calibration_file: str | None, runtime: Runtime
) -> dict[str, Any]:
    try:
        item = json.loads(line)
    except json.JSONDecodeError as exc:
        raise LegatoError(f"not a JSON object: {exc.msg} at column {exc.colno}") from None
    if not isinstance(item, dict):
        raise LegatoError("each line must be a JSON object")
    unknown = set(item) - {"model", "cluster", "strategy", "nodes", "seq", "runtime"}
    missing = {"model", "cluster", "strategy"} - set(item)
    if unknown or missing:
        raise LegatoError(
            f"line keys must be model, cluster, strategy and optional nodes, seq, runtime; "
            f"missing {sorted(missing)}, unknown {sorted(unknown)}"
        )
    model, cluster = _load(item["model"], item["cluster"], item.get("nodes"), item.get("seq"))
    calibration = _calibration(calibration_file, item["cluster"])
    if "runtime" in item:
        runtime = parse_runtime(item["runtime"])
    strategy = _strategy(item["strategy"])
    return predict_one(model, cluster, strategy, overlap, calibration, runtime)


def _run_batch(path: str, overlap: bool, calibration_file: str | None, runtime: Runtime) -> int:
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as exc:
        raise LegatoError(f"--batch: cannot read {path}: {exc.strerror}") from None
    failed = 0
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            out = _batch_line(line, overlap, calibration_file, runtime)
        except LegatoError as exc:
            failed += 1
            out = {"error": f"line {number}: {exc}"}
        print(json.dumps(out), flush=True)
    if failed:
        print(f"legato: error: {failed} of the batch lines failed", file=sys.stderr)
    return 2 if failed else 0


def _run_plan(args: argparse.Namespace, extra: list[str]) -> int:
    model, cluster = _load(args.model, args.cluster, args.nodes, args.seq)
    if args.top < 1:
        raise LegatoError(f"--top must be >= 1, got {args.top}")
    if args.config_rank is not None and not args.config:
        raise LegatoError("--config-rank: needs --config OUT.toml")
    if args.config_rank is not None and not 1 <= args.config_rank <= args.top:
        raise LegatoError(
            f"--config-rank: must be in [1, --top = {args.top}], got {args.config_rank}"
        )
    schedules = tuple(filter(None, (x.strip() for x in args.schedules.split(","))))
    space = SearchSpace(
        max_tp=args.max_tp, two_d_tp=not args.no_2d, dtype=args.dtype, schedules=schedules
    )
    runtime = parse_runtime(args.runtime, "--runtime")
    scorer = _scorer(_calibration(args.calibration, args.cluster), runtime)
    report = make_plan(model, cluster, args.gbs, top_k=args.top, space=space, scorer=scorer)
    if args.json:
        print(json.dumps(report.to_dict()))
    else:
        _print_plan(report)
    if args.config:
        _write_train_config(args, model, cluster, report)
    return 0


def _write_train_config(args: argparse.Namespace, model: ModelSpec, cluster: ClusterSpec,
                        report: PlanReport) -> None:  # fmt: skip
    """``--config``: the first ranked plan that ``legato train`` can place (or the
    ``--config-rank``-th), as a config; beside it the torchrun command of a multi-host plan."""
    from legato.atomic import naming, write_text_atomic
    from legato.cli.torchrun import script_path, torchrun_script
    from legato.parallel.job import TRAINED_DTYPE
    from legato.train.config import render_toml

    if args.dtype not in TRAINED_DTYPE:
        raise LegatoError(f"--config: --dtype {args.dtype} is priced but not trained; "
                          f"use one of {', '.join(TRAINED_DTYPE)}")  # fmt: skip
    ranked = list(enumerate(report.result.ranked, 1))
    if args.config_rank is not None:
        if args.config_rank > len(ranked):
            raise LegatoError(f"--config-rank: only {len(ranked)} plans fit, got "
                              f"{args.config_rank}")  # fmt: skip
        ranked = ranked[args.config_rank - 1 : args.config_rank]
    refused = []
    for rank, scored in ranked:
        text = scored.strategy.to_string()
        config = _train_config(args, model, cluster, scored.strategy)
        try:
            config.job(model, cluster.world_size)  # what `legato train` will check
        except LegatoError as exc:
            refused.append(f"#{rank}: {exc}")
            continue
        header = (f"legato train config for plan #{rank} of `legato plan --model {args.model} "
                  f"--cluster {args.cluster} --gbs {args.gbs}`: {text}")  # fmt: skip
        with naming("--config"):
            write_text_atomic(args.config, render_toml(config, header))
        wrote = [args.config]
        if cluster.nodes > 1:  # more than `legato train` starts on one host
            script = torchrun_script(cluster.nodes, cluster.devices_per_node, args.config, header)
            with naming("--config"):
                wrote.append(str(write_text_atomic(script_path(args.config), script)))
        skipped = f" (skipped {'; '.join(refused)})" if refused else ""
        print(f"wrote {' and '.join(wrote)}: plan #{rank}, {text}{skipped}", file=sys.stderr)
        return
    if args.config_rank is not None:
        raise LegatoError(f"--config-rank: plan {refused[0]}")
    raise LegatoError(f"--config: none of the {len(refused)} plans shown runs in `legato "
                      f"train` yet: {'; '.join(refused)} (raise --top to see more)")  # fmt: skip


def _train_config(args: argparse.Namespace, model: ModelSpec, cluster: ClusterSpec,
                  strategy: Strategy):  # fmt: skip
    """The ``legato train`` config of one plan: model, batch, dtype (in the strategy
    string), nodes x devices per node; ``parallel.cluster`` when --cluster is a file (a
    calibrated cluster prices the run; a preset leaves it to the host)."""
    from legato.train.config import (
        DataSection,
        ModelSection,
        ParallelSection,
        TrainConfig,
        TrainSection,
    )  # fmt: skip

    return TrainConfig(
        model=ModelSection(preset=args.model, overrides={"seq_len": args.seq} if args.seq else {}),
        data=DataSection(seq_len=model.seq_len),
        train=TrainSection(global_batch_size=args.gbs, micro_batch_size=strategy.mbs),
        parallel=ParallelSection(
            nproc=cluster.devices_per_node,
            nodes=cluster.nodes,
            strategy=strategy.to_string(),
            cluster=args.cluster if os.path.isfile(args.cluster) else "",
        ),
    )


def _scorer(calibration: Calibration, runtime: Runtime) -> Scorer | None:
    """The cost model under ``calibration`` and ``runtime`` (None: the planner's default
    scorer, which is both defaults')."""
    if calibration == CALIBRATION and runtime == Runtime():
        return None
    from legato.cost.training_step import predict

    return functools.partial(predict, calibration=calibration, runtime=runtime)


def _console() -> Console:
    console = Console()
    return console if console.is_terminal or "COLUMNS" in os.environ else Console(width=180)


def _explain_table(b: dict[str, Any], step: float) -> Table:
    """The step's terms (they add up to it), then each axis's collectives and overlap."""
    table = Table(title="where the step goes", box=box.SIMPLE, show_header=False)
    for name, seconds in b.get("compute_by_class_s", {}).items():
        table.add_row(f"compute: {name}", _fmt(seconds))
    for key in ("recompute_s", "contention_s", "bubble_s", "optimizer_s"):
        table.add_row(key.removesuffix("_s"), _fmt(b.get(key, 0.0)))
    for axis, seconds in b.get("exposed_comm_s", {}).items():
        table.add_row(f"exposed {axis}", _fmt(seconds))
    table.add_row("= step", _fmt(step))
    table.add_row("runtime profile", b.get("runtime_profile", "-"))
    for axis, how in b.get("collectives", {}).items():
        table.add_row(f"{axis} collectives", how)
    for line in b.get("overlap", []):
        table.add_row(
            f"{line['axes']} {line.get('collective', '')} ({line['pass']})".replace("  ", " "),
            f"{_fmt(line['comm_s'])} s: {_fmt(line['hidden_s'])} hidden behind "
            f"{line['behind']}, {_fmt(line['exposed_s'])} exposed",
        )
    return table


def _prediction_table(result: dict[str, Any]) -> Table:
    table = Table(title=f"{result['model']} on {result['devices']} x {result['cluster']}: "
                  f"{result['strategy']}", box=box.SIMPLE, show_header=False)  # fmt: skip
    for key in ("step_time_s", "tokens_per_s", "mfu", "hfu", "tflops_per_device", "memory_gib"):
        table.add_row(key, f"{result[key]:.4g}")
    table.add_row("fits", "yes" if result["fits"] else f"no: {result['why_not_fits']}")
    for key, value in result["breakdown"].items():
        if isinstance(value, list):  # what hid behind what: --explain
            continue
        if isinstance(value, dict):
            key = "memory_gib by term" if key == "memory_gib" else key
            table.add_row(key, ", ".join(f"{k} {_fmt(v)}" for k, v in value.items()) or "-")
        else:
            table.add_row(key, _fmt(value))
    return table


def _fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _axes(terms: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.3g}" for k, v in terms.items() if v) or "-"


def _plan_table(data: dict[str, Any], rows: list[tuple[str, dict]], with_strategy: bool) -> Table:
    table = Table(
        title=f"{data['model']} on {data['devices']} x {data['cluster']}, gbs={data['gbs']}, "
        f"seq={data['seq_len']}",
        box=box.SIMPLE,
    )
    table.add_column("#", justify="right", no_wrap=True)
    if with_strategy:
        table.add_column("strategy", no_wrap=True)
    for column in ("tokens/s", "step s", "MFU", "GiB", "compute s", "bubble s"):
        table.add_column(column, justify="right")
    table.add_column("exposed comm s", overflow="fold")
    for rank, p in rows:
        strategy = [p["strategy"]] if with_strategy else []
        table.add_row(
            rank, *strategy, f"{p['tokens_per_s']:,.0f}", f"{p['step_time_s']:.4g}",
            f"{p['mfu']:.1%}", f"{p['memory_gib']:.1f}", f"{p['compute_s'] or 0:.4g}",
            f"{p['bubble_s'] or 0:.4g}", _axes(p["exposed_comm_s"]),
        )  # fmt: skip
    return table


def _print_plan(report: PlanReport) -> None:
    """The plan table. Strategy strings are what users copy into ``--strategy`` or
    ``parallel.strategy``, so they are never wrapped: on a terminal too narrow for them
    inside the table, they are listed below it, one whole string per line."""
    data = report.to_dict()
    console = _console()
    rows = [(str(i), p) for i, p in enumerate(data["plans"], 1)]
    if data["baseline"] is not None:
        rows.append(("base", data["baseline"]))
    table = _plan_table(data, rows, with_strategy=True)
    unbounded = console.options.update_width(1 << 16)
    fits = Measurement.get(console, unbounded, table).maximum <= console.width
    console.print(table if fits else _plan_table(data, rows, with_strategy=False))
    if not fits:
        console.print(f"{'#':>6}   strategy")
        for rank, p in rows:
            console.print(f"{rank:>6}   {p['strategy']}", soft_wrap=True)
    for line in data["plans"][0]["techniques"]:
        console.print(f"#1 uses {line}")
    if data["runner_up"]:
        console.print(data["runner_up"], soft_wrap=True)
    if data["gain_over_baseline"] is not None:
        console.print(
            f"predicted gain over the heuristic (base): {data['gain_over_baseline']:.3f}x"
        )
    else:
        console.print(f"heuristic: {data['baseline_reason']}")
    stats = data["search"]
    console.print(
        f"searched {stats['shapes']} factorisations, scored {stats['scored']} candidates "
        f"({stats['fits']} fit, {stats['skipped_dominated']} dominated skipped) "
        f"in {stats['elapsed_s']:.2f} s"
    )
