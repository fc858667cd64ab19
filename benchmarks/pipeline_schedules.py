"""Pipeline schedules executed for real: legato's runtime next to torch.distributed.pipelining.

Two (``--stages``) gloo processes, one thread each, run the same model and batch under
legato's 1F1B, interleaved 1F1B, ZB-V, Seq1F1B (k = 4) and SVPP (k = 4 slices, v = 2
chunks, split W in 2 subtasks; ``--svpp-memory-cap`` sets its cap) and under torch's ``Schedule1F1B``, ``ScheduleInterleaved1F1B`` and ``ScheduleZBVZeroBubble``.
Per case it prints JSON lines:

ZB-V and SVPP are planned with the F:B:W ratio measured on this model first (two steps
of ZB-V), as MEPipe's scheduler uses its profiler; ``case.planned_with`` records it.

* ``step_time_s``: median over repeats of the slowest rank's step (lower is better);
  ``predicted`` is ``legato.schedule.simulate`` on the same schedule with the per-action
  times this run measured (median over repeats) and the measured one-way P2P latency;
* ``peak_activation_bytes``: the most activation bytes alive at once on the worst rank
  (``ActivationMeter``: saved-for-backward tensors plus what the runtime keeps of a unit,
  by storage; lower is better); ``predicted`` is the simulator's peak (fraction of
  1F1B's stage-0 peak) times legato 1F1B's measured peak; ``per_rank`` lists all ranks.

``ratio`` = value / baseline_value with torch's ``Schedule1F1B`` as the baseline. The goal
checked in BENCHMARKS.md: SVPP at k = 4 holds <= 40 % of 1F1B's peak at no more step time.

    python benchmarks/pipeline_schedules.py [--quick] [--repeats 5] [--stages 2]
        [--microbatches 2*stages] [--svpp-memory-cap UNITS]
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from legato.models import build_model
from legato.parallel.pipeline import (
    ActivationMeter,
    PipelineRunner,
    build_stages,
    token_cross_entropy,
)
from legato.schedule import CostModel, MeasuredCosts, StagePlacement, build_schedule, simulate
from legato.specs.model import ModelSpec
from report import print_row, result_row

BASELINE = "torch_Schedule1F1B"
PLANNED = ("zb-v", "svpp")  # greedy builders that plan with the measured F:B:W costs
LEGATO_CASES = [
    ("1f1b", {}),
    ("interleaved", {"chunks": 2}),
    ("zb-v", {}),
    ("seq1f1b", {"slices": 4}),
    ("svpp", {"chunks": 2, "slices": 4, "w_subtasks": 2}),
]
TORCH_CASES = [  # (class name, chunks, placement shape)
    ("Schedule1F1B", 1, "interleaved"),
    ("ScheduleInterleaved1F1B", 2, "interleaved"),
    ("ScheduleZBVZeroBubble", 2, "v"),
]


def _spec(quick: bool, stages: int) -> tuple[ModelSpec, int]:
    """The model (one block per virtual stage of the 2-chunk schedules) and the rows per
    micro-batch. Slices need a few hundred tokens each for CPU GEMMs to stay efficient
    (at 128 tokens per slice they cost ~30% more here, at 512 about 5%)."""
    if quick:
        spec = ModelSpec(name="bench-quick", hidden_size=64, num_layers=2 * stages, num_heads=4,
                         num_kv_heads=2, ffn_hidden_size=176, vocab_size=256, seq_len=256)  # fmt: skip
        return spec, 2
    spec = ModelSpec(name="bench", hidden_size=256, num_layers=2 * stages, num_heads=8,
                     num_kv_heads=4, ffn_hidden_size=704, vocab_size=1024, seq_len=512)  # fmt: skip
    return spec, 4


class _LegatoCase:
    def __init__(self, spec, name, options, rank, p, m, costs: CostModel | None = None) -> None:
        planned = {"costs": costs} if costs is not None and name in PLANNED else {}
        self.schedule = build_schedule(name, stages=p, microbatches=m, **options, **planned)
        self.model = build_model(spec, seed=0)
        stages = build_stages(self.model, self.schedule.placement, rank)
        self.runner = PipelineRunner(stages, self.schedule, rank=rank, measure=True)
        self.label = f"legato_{name}"
        self.case = {"runtime": "legato", "schedule": name, **options}
        if planned:
            self.case["planned_with"] = {"f": costs.f, "b": costs.b, "w": costs.w}

    def step(self, ids, labels) -> int:
        self.model.zero_grad(set_to_none=True)
        self.runner.step(ids, labels)
        return self.runner.stats.peak_activation_bytes


class _TorchCase:
    def __init__(self, spec, cls_name, chunks, shape, rank, p, m) -> None:
        from torch.distributed import pipelining

        placement = StagePlacement(p, chunks, shape)
        self.model = build_model(spec, seed=0)
        modules = build_stages(self.model, placement, rank)
        stages = [
            pipelining.PipelineStage(module, vs, placement.num_stages, torch.device("cpu"))
            for vs, module in sorted(modules.items(), key=lambda kv: placement.chunk(kv[0]))
        ]
        tokens = spec.seq_len

        def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            return token_cross_entropy(logits, labels) / (labels.shape[0] * tokens)

        cls = getattr(pipelining, cls_name)
        self.schedule = cls(stages if chunks > 1 else stages[0], m, loss_fn=loss_fn)
        self.first, self.last = 0 in modules, placement.num_stages - 1 in modules
        self.meter = ActivationMeter(exclude=list(self.model.parameters()))
        self.label = f"torch_{cls_name}"
        self.case = {"runtime": "torch", "schedule": cls_name, "chunks": chunks}

    def step(self, ids, labels) -> int:
        self.model.zero_grad(set_to_none=True)
        self.meter.reset_peak()
        args = (ids,) if self.first else ()
        kwargs: dict[str, Any] = {"target": labels, "losses": []} if self.last else {}
        with self.meter.saved_tensors():
            self.schedule.step(*args, **kwargs)
        return self.meter.peak


def _latency(rank: int, shape: tuple[int, ...], trips: int = 20) -> float:
    """Median one-way time of a message of ``shape`` between ranks 0 and 1 (ping-pong)."""
    tensor, times = torch.zeros(shape), []
    for i in range(trips):
        dist.barrier()
        start = time.perf_counter()
        if rank == 0:
            dist.send(tensor, 1, tag=i)
            dist.recv(tensor, 1, tag=i)
        elif rank == 1:
            dist.recv(tensor, 0, tag=i)
            dist.send(tensor, 0, tag=i)
        times.append((time.perf_counter() - start) / 2)
    return statistics.median(times)


def _measured_costs(spec, rank, p, m, ids, labels) -> CostModel:
    """F:B:W time of one unit, from two steps of legato's ZB-V on this model (both ranks
    agree: sums are all-reduced), so the greedy builders plan with this machine's ratios."""
    case = _LegatoCase(spec, "zb-v", {}, rank, p, m)
    for _ in range(2):
        case.step(ids, labels)
    totals = torch.zeros(3, dtype=torch.float64)
    for a, t in case.runner.stats.action_seconds.items():
        totals["FBW".index(a.kind)] += t
    dist.all_reduce(totals)
    b, w = (totals[1:] / totals[0]).tolist()
    return CostModel(f=1.0, b=round(b, 3), w=round(w, 3))


def _worker(
    rank: int, world: int, store: str, out: str, quick: bool, repeats: int, m: int, cap: int | None
) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=300))  # fmt: skip
    spec, rows = _spec(quick, world)
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, spec.vocab_size, (m * rows, spec.seq_len), generator=generator)
    labels = torch.randint(0, spec.vocab_size, (m * rows, spec.seq_len), generator=generator)
    latency = _latency(rank, (rows, spec.seq_len // 4, spec.hidden_size))
    costs = _measured_costs(spec, rank, world, m, ids, labels)
    legato = [(n, {**o, "memory_cap": cap} if n == "svpp" and cap else o) for n, o in LEGATO_CASES]
    cases = [_LegatoCase(spec, n, o, rank, world, m, costs) for n, o in legato]
    cases += [_TorchCase(spec, c, v, s, rank, world, m) for c, v, s in TORCH_CASES]
    times: dict[str, list[float]] = {c.label: [] for c in cases}
    peaks: dict[str, int] = {}
    actions: dict[str, dict[Any, list[float]]] = {c.label: {} for c in cases}
    for repeat in range(repeats + 1):  # round-robin so machine drift hits every case alike
        for c in cases:
            dist.barrier()
            start = time.perf_counter()
            peak = c.step(ids, labels)
            elapsed = torch.tensor(time.perf_counter() - start, dtype=torch.float64)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
            if repeat == 0:  # warm-up
                continue
            times[c.label].append(elapsed.item())
            peaks[c.label] = peak
            if isinstance(c, _LegatoCase):
                for a, t in c.runner.stats.action_seconds.items():
                    actions[c.label].setdefault(a, []).append(t)
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, (peaks, actions))
    if rank == 0:
        merged: dict[str, dict[Any, float]] = {}
        for _, acts in gathered:
            for label, per_action in acts.items():
                for a, ts in per_action.items():
                    merged.setdefault(label, {})[str(a)] = statistics.median(ts)
        result = {
            "spec": spec.name,
            "rows_per_microbatch": rows,
            "latency_s": latency,
            "cases": [
                {
                    "label": c.label,
                    "case": c.case,
                    "step_time_s": statistics.median(times[c.label]),
                    "peak_per_rank": [g[0][c.label] for g in gathered],
                    "schedule": c.schedule.to_dict() if isinstance(c, _LegatoCase) else None,
                    "durations": merged.get(c.label),
                }
                for c in cases
            ],
        }
        Path(out).write_text(json.dumps(result, default=str))
    dist.barrier()
    dist.destroy_process_group()


def _report(result: dict[str, Any], p: int, m: int) -> list[dict[str, Any]]:
    from legato.schedule import Action, Schedule

    cases = {c["label"]: c for c in result["cases"]}
    base = cases[BASELINE]
    base_time, base_peak = base["step_time_s"], max(base["peak_per_rank"])
    ref_peak = max(cases["legato_1f1b"]["peak_per_rank"])
    lines = []
    for c in result["cases"]:
        predicted_time = predicted_peak = None
        if c["schedule"] is not None:
            schedule = Schedule.from_dict(c["schedule"])
            durations = {Action.parse(a): t for a, t in c["durations"].items()}
            costs = MeasuredCosts(durations, CostModel(latency=result["latency_s"]))
            sim = simulate(schedule, costs)
            predicted_time = sim.makespan
            predicted_peak = max(sim.peak_fraction) * ref_peak
        case = {**c["case"], "stages": p, "microbatches": m, "model": result["spec"],
                "rows_per_microbatch": result["rows_per_microbatch"]}  # fmt: skip
        peak = max(c["peak_per_rank"])
        for metric, value, baseline, predicted, extra in (
            ("step_time_s", c["step_time_s"], base_time, predicted_time, {}),
            ("peak_activation_bytes", peak, base_peak, predicted_peak,
             {"per_rank": c["peak_per_rank"], "fraction_of_legato_1f1b": peak / ref_peak}),
        ):  # fmt: skip
            lines.append(result_row("pipeline_schedules", case, metric, value, BASELINE, baseline,
                                    predicted=predicted, **extra))  # fmt: skip
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small model, 2 repeats (< 1 min)")
    parser.add_argument("--repeats", type=int, default=None, help="timed steps per case")
    parser.add_argument("--stages", type=int, default=2, help="pipeline ranks (processes)")
    parser.add_argument("--microbatches", type=int, default=None, help="default 2 * stages")
    parser.add_argument("--svpp-memory-cap", type=int, default=None, help="slice units per rank")
    args = parser.parse_args(argv)
    repeats = args.repeats or (2 if args.quick else 5)
    m = args.microbatches or 2 * args.stages
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "result.json")
        store = str(Path(tmp) / "store")
        worker_args = (args.stages, store, out, args.quick, repeats, m, args.svpp_memory_cap)
        mp.spawn(_worker, args=worker_args, nprocs=args.stages, join=True)
        result = json.loads(Path(out).read_text())
    for line in _report(result, args.stages, m):
        print_row(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
