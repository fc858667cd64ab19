"""Local truth: the cost model's step time for the trainer on this machine, against the trainer.

For each process count N (1 and 2): measure the host as N training processes see it
(``legato calibrate``'s measurement, or cluster files it wrote, ``--cluster``), then run
``legato train`` on the ``tiny`` model with N processes (FSDP2 over gloo when N > 1) in a
subprocess, and take the median ``step_time_s`` of ``metrics.jsonl`` after the warm-up
steps. The prediction is ``legato.cost.training_step`` for the same job:
``Strategy(dp=N, zero=3, mbs, gbs, dtype="fp32")`` (the trainer's default batch) on the
calibrated cluster, eager kernels (``Runtime(fused_elementwise=False)``), and

* ``calibration = "measured"``: the machine's own constants, as ``legato predict --cluster
  FILE`` reads them from the side file (``legato.cost.calibration.calibration_beside``;
  the file's figures are achieved rates, so no GPU efficiency is applied on top) and
  ``overlap=False`` (``legato predict --no-overlap``): gloo moves bytes with the cores that
  compute, and FSDP2 has no side streams on the CPU, so the training thread waits in every
  all-gather and reduce-scatter (profiled);
* ``calibration = "default"``: the GPU-fitted ``CALIBRATION`` and ``predict``'s defaults
  on the same cluster file (what ``legato predict --cluster FILE`` computes today).

The per-kernel term, checked: ``kernels_per_microbatch`` counts the forward and backward
kernels of the real model big enough to be multi-threaded (a dispatch hook), beside the
cost model's estimate (``legato.cost.runtime.kernels_per_pass``), and ``fork_join_s`` is
what ``Calibration.kernel_overhead_s`` would add to the step if it were the calibration's
fork/join probe (``Measurement.parallel_overhead_s``), which ``measured_calibration`` does
not charge.

On a shared machine the load from other processes drifts, and the rates a process gets
drift with it: each N is calibrated right before its training run and again right after
it; ``value`` is the prediction from the first, ``value_after`` from the second, and
their spread shows how much of the error is drift. Medians everywhere for that reason.

One JSON object per line, metric ``step_time_s``: ``value`` is the prediction,
``baseline_value`` the measured median, ``ratio = value / baseline_value`` (1 is a perfect
prediction; ``error_pct = 100 (ratio - 1)``). ``--quick``: quick calibration, 10 steps.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from legato.calibrate.cluster_file import read_measurement, write_cluster_file
from legato.calibrate.host import Measurement, calibrate
from legato.cost.calibration import calibration_beside
from legato.cost.prediction import Prediction
from legato.cost.runtime import Runtime, kernels_per_pass
from legato.cost.training_step import predict
from legato.specs import load_cluster, load_model
from legato.specs.strategy import Strategy
from legato.train.config import TrainConfig
from report import emit

MODEL = "tiny"


def measured_step_time(nproc: int, steps: int, warmup: int, run_dir: Path) -> dict:
    """Median, quartiles and count of the trainer's step times after ``warmup`` steps."""
    command = [
        *(sys.executable, "-m", "legato.cli.main", "train"),
        f"--model.preset={MODEL}",
        f"--parallel.nproc={nproc}",
        f"--train.steps={steps}",
        f"--train.log_every={steps}",
        "--checkpoint.every=0",
        f"--run.dir={run_dir}",
    ]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise SystemExit(f"legato train failed:\n{proc.stderr[-2000:]}")
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    times = [json.loads(line)["step_time_s"] for line in lines][warmup:]
    q1, _, q3 = statistics.quantiles(times, n=4)
    return {"median": statistics.median(times), "q1": q1, "q3": q3, "steps": len(times)}


def strategy(nproc: int) -> Strategy:
    train = TrainConfig().train
    mbs, gbs = train.micro_batch_size, train.global_batch_size
    return Strategy(dp=nproc, zero=3, mbs=mbs, gbs=gbs, dtype="fp32")


RUNTIME = Runtime(fused_elementwise=False)


def predicted(nproc: int, cluster_file: Path, measured: bool) -> Prediction:
    """With the constants of the file's side file, or the defaults; see the docstring."""
    model, cluster = load_model(MODEL), load_cluster(cluster_file)
    if not measured:
        return predict(model, cluster, strategy(nproc), runtime=RUNTIME)
    calibration = calibration_beside(cluster_file)
    if calibration is None:
        raise SystemExit(f"{cluster_file}: no `legato calibrate` side file beside it")
    return predict(
        model, cluster, strategy(nproc), overlap=False, runtime=RUNTIME, calibration=calibration
    )


def model_kernels() -> int:
    """The cost model's kernels per micro-batch for ``MODEL`` on one stage."""
    k = kernels_per_pass(RUNTIME)
    return load_model(MODEL).num_layers * (k.block_fwd + k.block_bwd) + k.edge_fwd + k.edge_bwd


def parallel_kernels(mbs: int) -> int:
    """Forward and backward kernels of one ``mbs``-sequence micro-batch of the model whose
    output has more elements than PyTorch's parallel grain size (views excluded)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from legato.calibrate.compute import GRAIN_SIZE
    from legato.models import build_model

    class Count(TorchDispatchMode):
        kernels = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            outs = out if isinstance(out, (tuple, list)) else [out]
            big = any(isinstance(t, torch.Tensor) and t.numel() > GRAIN_SIZE for t in outs)
            Count.kernels += big and not func.is_view
            return out

    spec = load_model(MODEL)
    model = build_model(spec, seed=0, device=torch.device("cpu"))
    tokens = torch.randint(0, spec.vocab_size, (mbs, spec.seq_len))
    with Count():
        logits = model(tokens)
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flatten()).backward()
    return Count.kernels


def calibrated(m: Measurement) -> dict:
    """The measured figures a prediction rests on, for the record."""
    return {
        "gemm_gflops": round(m.gemm_fit.peak_flops / 1e9, 1),
        "gemm_half_dim": round(m.gemm_fit.half_dim, 1),
        "elementwise_gbps": round(m.elementwise_bandwidth / 1e9, 2),
        "attention_gflops": round(m.attention_rate / 1e9, 1),
        "parallel_overhead_us": round(m.parallel_overhead_s * 1e6, 1),
        "link_latency_us": round(m.link.latency_s * 1e6, 1) if m.link else None,
        "link_gbps": round(m.link.bandwidth / 1e9, 3) if m.link else None,
    }


def emit_prediction(
    nproc: int, name: str, prediction: Prediction, measured: dict, extra: dict
) -> None:
    ratio = prediction.step_time_s / measured["median"]
    b = prediction.breakdown
    emit(
        "local_truth",
        {"model": MODEL, "nproc": nproc, "calibration": name},
        "step_time_s",
        prediction.step_time_s,
        "measured",
        measured["median"],
        digits=4,
        ratio_digits=3,
        error_pct=round(100 * (ratio - 1), 1),
        measured_q1_q3=[round(measured["q1"], 4), round(measured["q3"], 4)],
        measured_steps=measured["steps"],
        predicted_terms={
            "compute_s": round(b["compute_s"], 4),
            "optimizer_s": round(b["optimizer_s"], 4),
            "exposed_comm_s": {k: round(v, 4) for k, v in b["exposed_comm_s"].items()},
        },
        **extra,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="quick calibration, 10 steps")
    parser.add_argument(
        "--cluster",
        action="append",
        default=[],
        help="a cluster file from `legato calibrate` (repeatable; its devices_per_node is N) "
        "instead of measuring now",
    )
    parser.add_argument("--nproc", type=int, nargs="+", default=[1, 2], help="process counts")
    parser.add_argument("--steps", type=int, default=None, help="training steps (default 30)")
    args = parser.parse_args()
    steps = args.steps or (10 if args.quick else 30)
    given = {load_cluster(path).world_size: Path(path) for path in args.cluster}
    kernels = parallel_kernels(strategy(1).mbs)
    with tempfile.TemporaryDirectory(prefix="legato-local-truth-") as tmp:
        for nproc in sorted(given) if given else args.nproc:
            run_case(nproc, given.get(nproc), args.quick, steps, kernels, Path(tmp))


def run_case(nproc: int, given: Path | None, quick: bool, steps: int, kernels: int, tmp: Path):
    """Calibrate (or read ``given``), train, calibrate again, and print the two rows."""
    if given is not None:
        cluster_file, m = given, read_measurement(given)
    else:
        m = calibrate(nproc, quick=quick)
        cluster_file = write_cluster_file(m, tmp / f"local-{nproc}.toml")
    print(f"local_truth: training {MODEL} with {nproc} process(es)", file=sys.stderr)
    measured = measured_step_time(nproc, steps, max(2, steps // 6), tmp / f"run-{nproc}")
    extra = {"calibrated": calibrated(m)}
    if given is None:
        after = calibrate(nproc, quick=quick)
        value = predicted(nproc, write_cluster_file(after, tmp / "after.toml"), True).step_time_s
        extra["value_after"] = round(value, 4)
        extra["error_pct_after"] = round(100 * (value / measured["median"] - 1), 1)
        extra["calibrated_after"] = calibrated(after)
    modelled = model_kernels()
    extra["kernels_per_microbatch"] = {"counted": kernels, "cost_model": modelled}
    overhead = m.parallel_overhead_s * modelled * strategy(nproc).num_microbatches
    extra["fork_join_s"] = round(overhead, 4)
    emit_prediction(nproc, "measured", predicted(nproc, cluster_file, True), measured, extra)
    emit_prediction(nproc, "default", predicted(nproc, cluster_file, False), measured, {})


if __name__ == "__main__":
    main()
