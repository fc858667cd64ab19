"""Predicted memory per device of XTuner's 200B-class case with and without its techniques.

Qwen3-235B-A22B at 64K tokens per sequence, FSDP only (ZeRO-3 over 256 H800 80 GB, one
sequence per device, no TP/PP/CP/EP), predicted by ``legato.cost.training_step`` with the
strategy's ``swap``, ``loss_chunk`` and ``dtype="fp8"``, and checked against the
standalone ``legato.cost.xtuner_terms.xtuner_memory``. Pure Python, about a second.

One JSON line per row (ratio = value / baseline_value; lower is better for memory,
higher for speed-ups):

* ``predicted_memory_gib``: with the techniques vs without (same recompute); ``extra``
  has xtuner_memory's figure (``xtuner_memory_gib``, must agree), whether it fits 80 GiB,
  host memory per device, the step time and the host-copy time left exposed.
* ``fp8_step_speedup``: predicted step time in bf16 over fp8 (block linears at the fp8
  peak, FP8-cached inputs), against XTuner's reported 1.225x (2,000 -> 2,450 tokens per
  GPU per second); ``extra`` has the Amdahl bound ``fp8_linear_speedup``.
* ``planner_memory_gib``: what ``legato.plan.search`` picks in the FSDP-only space (bf16,
  and with ``dtype=fp8`` asked for), against the same plan without swap / chunked loss.

    python benchmarks/xtuner_memory.py [--quick]
"""

from __future__ import annotations

import argparse
from dataclasses import replace

from legato.cost.memory import GIB
from legato.cost.training_step import predict
from legato.cost.xtuner_terms import XTunerOptions, fp8_linear_speedup, xtuner_memory
from legato.plan import SearchSpace, search
from legato.specs import load_cluster, load_model
from legato.specs.strategy import Strategy
from report import emit

SEQ = 65536
FSDP = Strategy(dp=256, zero=3, mbs=1, gbs=256)
TECHNIQUES = [  # swap, loss_chunk, fp8
    (True, 0, False),
    (False, 4096, False),
    (True, 4096, False),
    (True, 4096, True),
]
BENCHMARK = "xtuner_memory"
FSDP_ONLY = SearchSpace(max_tp=1, max_pp=1, max_cp=1, max_ep=1)


def memory_rows(model, cluster, recomputes: tuple[str, ...]) -> None:
    capacity = cluster.device.memory_gib
    for recompute in recomputes:
        plain = predict(model, cluster, FSDP.with_(recompute=recompute))
        for swap, chunk, fp8 in TECHNIQUES:
            s = FSDP.with_(recompute=recompute, swap=swap, loss_chunk=chunk)
            s = s.with_(dtype="fp8") if fp8 else s
            p = predict(model, cluster, s)
            x = xtuner_memory(model, s, XTunerOptions(swap=swap, loss_chunk=chunk or None, fp8=fp8))
            case = {"model": model.name, "seq": SEQ, "devices": cluster.world_size}
            case |= {"recompute": recompute, "swap": swap, "loss_chunk": chunk, "fp8": fp8}
            emit(
                BENCHMARK,
                case,
                "predicted_memory_gib",
                p.memory_gib,
                "fsdp_only",
                plain.memory_gib,
                extra=dict(
                    xtuner_memory_gib=x.total / GIB,
                    agrees=abs(p.memory_gib - x.total / GIB) < 1e-6,
                    fits=p.fits,
                    baseline_fits=plain.memory_gib <= capacity,
                    host_gib=p.breakdown.get("swap", {}).get("host_gib", 0.0),
                    terms_gib={k: round(v, 2) for k, v in p.breakdown["memory_gib"].items()},
                    step_time_s=p.step_time_s,
                    baseline_step_time_s=plain.step_time_s,
                    host_copy_s=p.breakdown["comm_s"].get("host", 0.0),
                    host_exposed_s=p.breakdown["exposed_comm_s"].get("host", 0.0),
                ),
            )


def fp8_row(model, cluster) -> None:
    s = FSDP.with_(recompute="full", swap=True, loss_chunk=4096)
    bf16, fp8 = predict(model, cluster, s), predict(model, cluster, s.with_(dtype="fp8"))
    case = {"model": model.name, "seq": SEQ, "devices": cluster.world_size,
            "strategy": s.to_string()}  # fmt: skip
    emit(
        BENCHMARK,
        case,
        "fp8_step_speedup",
        bf16.step_time_s / fp8.step_time_s,
        "xtuner_reported",
        2450 / 2000,
        extra=dict(
            amdahl_bound=fp8_linear_speedup(model, cluster.device, SEQ),
            tokens_per_device_s_bf16=bf16.tokens_per_s / cluster.world_size,
            tokens_per_device_s_fp8=fp8.tokens_per_s / cluster.world_size,
        ),
    )


def planner_rows(model, cluster) -> None:
    for dtype in ("bf16", "fp8"):
        best = search(model, cluster, FSDP.gbs, space=replace(FSDP_ONLY, dtype=dtype)).best
        lean = best.strategy.with_(swap=False, loss_chunk=0)
        without = predict(model, cluster, lean)
        case = {"model": model.name, "seq": SEQ, "devices": cluster.world_size,
                "space": "fsdp_only", "dtype": dtype}  # fmt: skip
        emit(
            BENCHMARK,
            case,
            "planner_memory_gib",
            best.prediction.memory_gib,
            "same_plan_without_swap_and_chunked_loss",
            without.memory_gib,
            extra=dict(
                strategy=best.strategy.to_string(),
                fits=best.prediction.fits,
                baseline_fits=without.fits,
                tokens_per_device_s=best.prediction.tokens_per_s / cluster.world_size,
            ),
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="full recompute rows only")
    args = parser.parse_args()
    model = load_model("qwen3-235b-a22b").with_(seq_len=SEQ)
    cluster = load_cluster("h800", nodes=32)
    memory_rows(model, cluster, ("full",) if args.quick else ("none", "full"))
    fp8_row(model, cluster)
    planner_rows(model, cluster)


if __name__ == "__main__":
    main()
