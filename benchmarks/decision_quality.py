"""Decision quality: does the cost model order plans, pick plans and judge fit as measured?

Users take decisions from the planner (which plan, will it fit), so this scores those,
per end-to-end source of ``legato.cost.published`` (the shared calibration tables and
the shipped data): within each group of runs of one job (same model, GPU type and count,
global batch; ``legato.cost.ranking``) the share of pairs of plans ordered as measured
and the pick regret (throughput the predicted-best plan loses to the measured best);
the published runs predicted not to fit (each of them ran: goal none); and the mean
error in the row's own metric, for reference.

ZeRO-3 against 3-D parallelism: for each published tensor + pipeline run of a model of
100B parameters or more, the same job under ZeRO-3 (data parallel over every GPU, one
or two sequences per GPU, full recompute) under the DeepSpeed ZeRO runtime profile
(``--zero3-runtime``). Published ZeRO-3 runs of 175B and 530B models on 768-2,240
A100s ran 1.5-3x slower than these 3-D layouts (issue 28's held-out tables), so the
right order is 3-D first; each line gives the predicted ZeRO-3 / 3-D throughput ratio
(goal below 1) and the ZeRO-3 run's parameter gathers: total and exposed.

No constant of the cost model is fitted on these rows (device profiles come from
micro-benchmarks), so every figure here is out of sample.

Output: one JSON object per line (``benchmarks/report.py``).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import replace

from legato.cost.calibration import CALIBRATION
from legato.cost.published import Case, Result, evaluate, load_cases
from legato.cost.ranking import rank_groups, summary
from legato.cost.runtime import parse_runtime
from legato.cost.training_step import predict
from legato.specs.params import count_params
from legato.specs.strategy import Strategy
from report import emit

BENCHMARK = "decision_quality"
BIG_PARAMS = 100e9


def per_source(results: list[Result], label: str) -> None:
    """Error, pair ordering, pick regret and wrong fit verdicts of each source."""
    sources = list(dict.fromkeys(r.case.row["source"] for r in results))
    for source in [*sources, "all"]:
        mine = [r for r in results if source in ("all", r.case.row["source"])]
        stats = {k: round(v, 4) for k, v in summary(rank_groups(mine)).items()}
        emit(BENCHMARK, case={"source": source, "rows": len(mine), "predictions": label},
             metric="mean_abs_pct_error",
             value=round(100 * math.fsum(r.error for r in mine) / len(mine), 2),
             not_fit=[r.case.row["row_id"] for r in mine if not r.fits], **stats)  # fmt: skip


def zero3_against_3d(cases: list[Case], runtime_text: str) -> None:
    """The ZeRO-3 alternative of every big published 3-D run, predicted."""
    framework = parse_runtime(runtime_text, "--zero3-runtime")
    right = pairs = 0
    for case in cases:
        # the same kernels as the 3-D run (attention, dropout, fusion): only the framework's
        # way of moving weights and gradients differs
        kernels = ("flash_attention", "dropout", "fused_elementwise")
        runtime = replace(framework, **{k: getattr(case.runtime, k) for k in kernels})
        s = case.strategy
        if s.tp * s.pp == 1 or count_params(case.model).total < BIG_PARAMS:
            continue
        n = case.cluster.world_size
        mbs = 2 if s.gbs % (2 * n) == 0 else 1
        if s.gbs % n:
            continue
        zero3 = Strategy(dp=n, zero=3, mbs=mbs, gbs=s.gbs, recompute="full", dtype=s.dtype)
        three_d = predict(case.model, case.cluster, s, overlap=case.overlap,
                          runtime=case.runtime)  # fmt: skip
        z = predict(case.model, case.cluster, zero3, runtime=runtime)
        ratio = z.tokens_per_s / three_d.tokens_per_s
        pairs += 1
        right += ratio < 1
        emit(BENCHMARK, case={"row_id": case.row["row_id"], "devices": n,
                              "three_d": s.to_string(), "zero3": zero3.to_string(),
                              "zero3_runtime": runtime_text},
             metric="zero3_over_3d_throughput", value=round(z.tokens_per_s, 1),
             baseline="3-D plan (predicted)", baseline_value=round(three_d.tokens_per_s, 1),
             ratio_digits=3, goal="< 1",
             zero3_gathers_s=round(z.breakdown["comm_s"].get("dp", 0.0), 3),
             zero3_exposed_s=round(z.breakdown["exposed_comm_s"].get("dp", 0.0), 3),
             zero3_step_s=round(z.step_time_s, 3),
             zero3_contention_s=round(z.breakdown.get("contention_s", 0.0), 3))  # fmt: skip
    emit(BENCHMARK, case={"pairs": pairs}, metric="zero3_3d_ordered_right",
         value=right / pairs if pairs else None, goal=1.0)  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--zero3-runtime", default="profile=deepspeed-zero",
                        help="--runtime of the ZeRO-3 alternatives")  # fmt: skip
    args = parser.parse_args(argv)
    cases, _ = load_cases()
    per_source(evaluate(CALIBRATION, cases), "shipped constants")
    zero3_against_3d(cases, args.zero3_runtime)


if __name__ == "__main__":
    main()
