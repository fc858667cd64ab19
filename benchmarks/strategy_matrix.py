"""Strategy matrix: the 7-D runtime on this machine, the cost model's step against the measured.

For the ``tiny`` (dense) and ``tiny-moe`` presets, each strategy of ``MATRIX`` at 1, 2 and
4 processes is trained by ``legato train`` (a subprocess, the built-in corpus, the
default batch of 12 x 256 tokens) for ``--steps`` steps. Every run logs the cost model's
prediction for its own job on this host's calibration (``legato.train.prediction``: the
host measured by ``legato calibrate --quick`` for that process count, fresh for this
benchmark unless ``--cache`` is given), so a row is read from the run's own
``metrics.jsonl`` and ``summary.json``: the median step after ``WARMUP`` steps against
``predicted_step_time_s``, and the peak resident memory against the predicted peak.

Then ``parallel.strategy = auto`` runs once per (model, process count): its measured step
against the measured-fastest row of the matrix there (``auto_over_best``; 1.0 = auto
found the fastest, lower is faster than every row).

Rows, one JSON object per line: metric ``step_time_s``, ``value`` the prediction,
``baseline_value`` the measured median, ``ratio = predicted / measured`` (1 is a perfect
prediction), ``memory_ratio`` likewise; a final ``median_abs_error`` row with the median and the
worst ``|ratio - 1|`` over the matrix and each auto pick. ``--png`` draws predicted
against measured. ``--quick``: one and two processes, a few strategies, 5 steps.
``--device cuda --nproc 1``: the rows one GPU runs (``benchmarks/gpu/strategy_matrix_gpu.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from report import emit, note

WARMUP = 2
# model -> process count -> strategies (mbs=3 where dp=4 needs it: gbs 12 = mbs x dp x m)
MATRIX: dict[str, dict[int, list[str]]] = {
    "tiny": {
        1: ["", "recompute=selective", "recompute=full", "mbs=2", "loss_chunk=128"],
        2: ["zero=0", "zero=1", "zero=2", "zero=3", "tp=2", "tp=2,sp=1", "cp=2",
            "pp=2,schedule=1f1b", "pp=2,schedule=gpipe", "zero=3,recompute=full",
            "pp=2,schedule=zb-h1,recompute=selective", "pp=2,swap=1"],
        4: ["dp=4,mbs=3", "dp=4,mbs=3,zero=1", "tp=2,dp=2,mbs=3,zero=3",
            "pp=2,dp=2,mbs=3,zero=0", "cp=2,dp=2,mbs=3", "tp=2,cp=2,mbs=3,zero=3",
            "pp=2,dp=2,mbs=3,zero=1", "pp=2,tp=2,sp=1,mbs=3", "pp=2,cp=2,mbs=3,zero=1"],
    },
    "tiny-moe": {
        1: ["", "recompute=full"],
        2: ["zero=3", "zero=0", "ep=2,zero=3", "pp=2,schedule=1f1b", "tp=2", "tp=2,sp=1"],
        4: ["dp=4,mbs=3", "ep=4,dp=4,mbs=3,zero=3", "pp=2,dp=2,mbs=3,zero=0",
            "pp=2,ep=2,dp=2,mbs=3,zero=1", "tp=2,ep=2,dp=2,mbs=3,zero=3",
            "tp=2,sp=1,ep=2,dp=2,mbs=3,zero=2"],
    },
}  # fmt: skip
QUICK = {"tiny": {1: ["", "recompute=full"], 2: ["zero=3", "tp=2", "cp=2"]}}


def train(model: str, nproc: int, strategy: str, steps: int, run_dir: Path, device: str) -> dict:
    """One ``legato train`` run: what it measured and what it predicted."""
    command = [
        *(sys.executable, "-m", "legato.cli.main", "train"),
        f"--model.preset={model}",
        f"--parallel.nproc={nproc}",
        f"--parallel.strategy={strategy}",
        f"--train.steps={steps}",
        f"--train.log_every={steps}",
        "--checkpoint.every=0",
        f"--run.dir={run_dir}",
        f"--train.device={device}",
    ]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr else "failed"}
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((run_dir / "summary.json").read_text())
    invocation = json.loads((run_dir / "invocations.jsonl").read_text().splitlines()[0])
    times = [r["step_time_s"] for r in records if "loss" in r][WARMUP:]
    return {
        "strategy_run": invocation["config"]["parallel"]["strategy"],
        "measured_s": statistics.median(times),
        "predicted_s": records[-1]["predicted_step_time_s"],
        "measured_memory": summary["peak_memory_bytes"],
        "predicted_memory": summary.get("predicted_peak_memory_bytes"),
        "tokens_per_s": summary["tokens_per_s_median"],
    }


def run_matrix(matrix: dict, steps: int, tmp: Path, device: str) -> list[dict]:
    rows = []
    for model, by_nproc in matrix.items():
        for nproc, strategies in by_nproc.items():
            for strategy in strategies:
                name = f"{model}-{nproc}-{strategy or 'default'}".replace(",", "_")
                print(
                    f"strategy_matrix: {model} x{nproc} {strategy or '(default)'}", file=sys.stderr
                )
                got = train(model, nproc, strategy, steps, tmp / name, device)
                case = {"model": model, "nproc": nproc, "strategy": strategy}
                if "error" in got or got["predicted_s"] is None:
                    note("strategy_matrix", case=case, error=got.get("error", "no prediction"))
                    continue
                ratio = got["predicted_s"] / got["measured_s"]
                memory = (got["predicted_memory"] or 0) / got["measured_memory"]
                rows.append(emit(
                    "strategy_matrix", case, "step_time_s", got["predicted_s"], "measured",
                    got["measured_s"], digits=4, ratio_digits=3,
                    error_pct=round(100 * (ratio - 1), 1), memory_ratio=round(memory, 3),
                    predicted_memory_mib=round((got["predicted_memory"] or 0) / 2**20, 1),
                    measured_memory_mib=round(got["measured_memory"] / 2**20, 1),
                    strategy_run=got["strategy_run"], tokens_per_s=round(got["tokens_per_s"]),
                ))  # fmt: skip
    return rows


def run_auto(matrix: dict, rows: list[dict], steps: int, tmp: Path, device: str) -> list[dict]:
    """``auto`` once per (model, process count), against the measured-fastest row."""
    picks = []
    for model, by_nproc in matrix.items():
        for nproc in by_nproc:
            mine = [r for r in rows if r["case"]["model"] == model and r["case"]["nproc"] == nproc]
            if not mine:
                continue
            print(f"strategy_matrix: {model} x{nproc} auto", file=sys.stderr)
            got = train(model, nproc, "auto", steps, tmp / f"{model}-{nproc}-auto", device)
            case = {"model": model, "nproc": nproc, "strategy": "auto"}
            if "error" in got:
                note("strategy_matrix", case=case, error=got["error"])
                continue
            best = min(mine, key=lambda r: r["baseline_value"])
            predicted_best = min(mine, key=lambda r: r["value"])
            picks.append(emit(
                "strategy_matrix", case, "auto_step_time_s", got["measured_s"],
                "measured_fastest_row", best["baseline_value"], digits=4, ratio_digits=3,
                picked=got["strategy_run"], fastest_row=best["strategy_run"],
                predicted_fastest_row=predicted_best["strategy_run"],
                auto_predicted_s=round(got["predicted_s"], 4),
            ))  # fmt: skip
    return picks


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 6))
    markers = {"tiny": "o", "tiny-moe": "s"}
    colors = {1: "tab:blue", 2: "tab:orange", 4: "tab:green"}
    for r in rows:
        c = r["case"]
        ax.scatter(r["baseline_value"], r["value"], marker=markers[c["model"]],
                   color=colors[c["nproc"]], s=36)  # fmt: skip
    values = [v for r in rows for v in (r["value"], r["baseline_value"])]
    lo, hi = min(values) * 0.8, max(values) * 1.25
    ax.plot([lo, hi], [lo, hi], "k-", lw=1, label="predicted = measured")
    for band, style in ((0.15, "--"), (0.35, ":")):
        ax.plot([lo, hi], [lo * (1 + band), hi * (1 + band)], "k" + style, lw=0.7)
        ax.plot([lo, hi], [lo * (1 - band), hi * (1 - band)], "k" + style, lw=0.7,
                label=f"±{band:.0%}")  # fmt: skip
    for n, color in colors.items():
        ax.scatter([], [], color=color, label=f"{n} process(es)")
    for m, marker in markers.items():
        ax.scatter([], [], marker=marker, color="gray", label=m)
    ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi),
           xlabel="measured step time (s, median)", ylabel="predicted step time (s)",
           title="legato train: cost model vs measured, per strategy")  # fmt: skip
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1-2 processes, 5 strategies")
    parser.add_argument("--steps", type=int, default=None, help="steps per run (default 8)")
    parser.add_argument("--png", default="", help="write predicted against measured here")
    parser.add_argument("--cache", default="", help="LEGATO_CACHE_DIR to reuse calibrations")
    parser.add_argument("--nproc", type=int, nargs="+", default=None, help="only these counts")
    parser.add_argument("--model", nargs="+", default=None, help="only these presets")
    parser.add_argument("--device", default="cpu", help="train.device (cuda: benchmarks/gpu)")
    args = parser.parse_args()
    matrix = QUICK if args.quick else MATRIX
    if args.model:
        matrix = {m: by for m, by in matrix.items() if m in args.model}
    if args.nproc:
        matrix = {m: {n: v for n, v in by.items() if n in args.nproc} for m, by in matrix.items()}
    steps = args.steps or (5 if args.quick else 8)
    with tempfile.TemporaryDirectory(prefix="legato-strategy-matrix-") as tmp:
        os.environ["LEGATO_CACHE_DIR"] = args.cache or str(Path(tmp) / "cache")
        rows = run_matrix(matrix, steps, Path(tmp), args.device)
        picks = run_auto(matrix, rows, steps, Path(tmp), args.device)
    errors = [abs(r["ratio"] - 1) for r in rows]
    if errors:
        emit(
            "strategy_matrix", {"rows": len(rows)}, "median_abs_error", statistics.median(errors),
            digits=3, worst_abs_error=round(max(errors), 3),
            within_15pct=sum(e <= 0.15 for e in errors), within_35pct=sum(e <= 0.35 for e in errors),
            auto_over_fastest=[p["ratio"] for p in picks],
        )  # fmt: skip
    if args.png and rows:
        plot(rows, Path(args.png))
        print(f"strategy_matrix: wrote {args.png}", file=sys.stderr)


if __name__ == "__main__":
    main()
