"""``legato serve simulate`` with predicted step times against a real run (tiny preset, CPU).

The real engine serves one workload (S-LoRA's generator: Gamma arrivals, power-law adapter
popularity, uniform lengths; each adapter's prompts start with its own instruction, the
prefix its KV blocks cache) in wall-clock time. A step-time model (``serve/step_fit.py``:
seconds per step, per request, per new token, per attended position, per adapter) is
fitted on the measured steps of a *different* run — another seed and another rate — and
the simulator runs the first workload's arrivals on the same engine configuration with
those predicted step times. Rows: mean TTFT and mean TPOT simulated against real (ratio
simulated / real; the goal is within 15%), and the fitted model's error on the steps of
the run it did not see.

    python benchmarks/serving_sim_fidelity.py [--num-prompts 200]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from legato.data.tokenizer import ByteTokenizer
from legato.models import build_model
from legato.serve.clock import SimClock, WallClock
from legato.serve.decisions import DecisionLog
from legato.serve.engine import Engine, EngineConfig
from legato.serve.loading import generated_adapters
from legato.serve.simulate import (
    AdapterSize,
    Arrival,
    PredictedSteps,
    SimTokenizer,
    SimulatedBackend,
    report,
    run,
)
from legato.serve.step_fit import LinearStepTime, logged_batches
from legato.serve.workload import synthetic
from legato.specs.registry import load_model
from report import emit, note

BENCHMARK = "serving_sim_fidelity"
INSTRUCTION = 24  # tokens of each adapter's task instruction
CONFIG = dict(block_size=16, num_blocks=96, max_num_seqs=16, max_loras=4, policy="elora")


def workload(names: list[str], count: int, rate: float, seed: int) -> list[Arrival]:
    """``count`` requests at ``rate`` req/s (alpha 0.3, prompts 8-64 tokens after the
    adapter's instruction, 8-32 output tokens)."""
    rng = np.random.default_rng(1000 + seed)
    instructions = {n: rng.integers(97, 123, INSTRUCTION).tolist() for n in names}
    stream = synthetic(count, rate, 1.0, names, 0.3, (8, 64), (8, 32), seed=seed)
    return [
        Arrival(r.index, r.arrival_s, r.adapter,
                instructions[r.adapter] + rng.integers(32, 127, r.prompt_tokens).tolist(),
                r.output_tokens)
        for r in stream
    ]  # fmt: skip


def real_run(model, adapters, arrivals) -> tuple[Engine, list[dict], dict]:
    """The engine on the wall clock: itself, its decision log and its figures."""
    log = DecisionLog()
    engine = Engine(model, ByteTokenizer(), adapters, EngineConfig(**CONFIG),
                    clock=WallClock(time.monotonic()), decision_log=log)  # fmt: skip
    requests, times, orphans = run(engine, arrivals)
    return engine, log.records, report(engine, requests, times, orphans)


def simulated_run(real: Engine, arrivals, step_time) -> dict:
    """The same configuration on a simulated clock, steps priced by ``step_time``."""
    clock = SimClock()
    backend = SimulatedBackend(clock, PredictedSteps(step_time), real.backend.block_bytes,
                               real.max_model_len, real.backend.rank_elements(1),
                               real.backend.element_size)  # fmt: skip
    sizes = {n: AdapterSize(s.shape, s.numel) for n, s in real.memory.adapters.items()}
    engine = Engine(backend, SimTokenizer(), sizes, EngineConfig(**CONFIG), clock=clock)
    requests, times, orphans = run(engine, arrivals)
    return report(engine, requests, times, orphans)


def adapters_by_seq(arrivals) -> dict[int, str | None]:
    """The engine numbers requests in the order ``simulate.run`` adds them: by arrival."""
    ordered = sorted(arrivals, key=lambda a: a.arrival_s)
    return {seq: a.adapter for seq, a in enumerate(ordered)}


def one_pair(model, adapters, args, repeat: int) -> dict:
    """Fit on one run, compare on another (seeds of this ``repeat``): the figures."""
    names = list(adapters)
    fit_arrivals = workload(names, args.num_prompts, args.fit_rate, seed=1 + 2 * repeat)
    _, fit_records, _ = real_run(model, adapters, fit_arrivals)
    steps = LinearStepTime.fit(logged_batches(fit_records, adapters_by_seq(fit_arrivals)))
    arrivals = workload(names, args.num_prompts, args.rate, seed=2 + 2 * repeat)
    real, records, measured = real_run(model, adapters, arrivals)
    held_out = logged_batches(records, adapters_by_seq(arrivals))
    errors = [abs(steps.step_time(rows) / seconds - 1) for rows, seconds in held_out if seconds]
    simulated = simulated_run(real, arrivals, steps.step_time)
    note(BENCHMARK, repeat=repeat, fitted_seconds_per=steps.as_dict(),
         step_time_median_abs_error=statistics.median(errors),
         **{f"{m}_{k}": v[m] for m in ("mean_ttft_ms", "mean_tpot_ms")
            for k, v in (("real", measured), ("simulated", simulated))})  # fmt: skip
    return {"real": measured, "simulated": simulated, "error": statistics.median(errors)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-prompts", type=int, default=200)
    parser.add_argument("--rate", type=float, default=16.0, help="req/s of the compared run")
    parser.add_argument("--fit-rate", type=float, default=24.0, help="req/s of the fitted run")
    parser.add_argument("--adapters", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3, help="fit/compare pairs (median)")
    args = parser.parse_args()
    torch.set_num_threads(1)  # on shared cores a spinning thread pool makes steps chaotic
    model = build_model(load_model("tiny"), seed=0)
    adapters = generated_adapters(model, count=args.adapters, rank=8)
    note(BENCHMARK, model="tiny", num_prompts=args.num_prompts, rate=args.rate,
         fit_rate=args.fit_rate, adapters=args.adapters, repeats=args.repeats, **CONFIG)  # fmt: skip
    pairs = [one_pair(model, adapters, args, k) for k in range(args.repeats)]
    case = {"model": "tiny", "rate": args.rate, "fit_rate": args.fit_rate,
            "requests": args.num_prompts, "policy": CONFIG["policy"], "repeats": args.repeats}  # fmt: skip
    emit(BENCHMARK, case, "step_time_median_abs_error",
         statistics.median(p["error"] for p in pairs), digits=4)  # fmt: skip
    for metric in ("mean_ttft_ms", "mean_tpot_ms"):
        ratios = [p["simulated"][metric] / p["real"][metric] for p in pairs]
        ratio = statistics.median(ratios)
        k = ratios.index(ratio) if ratio in ratios else 0
        emit(BENCHMARK, case, metric, pairs[k]["simulated"][metric], "real_run",
             pairs[k]["real"][metric], digits=3, ratio=ratio, ratio_digits=3,
             ratios=[round(r, 3) for r in ratios], within_15pct=abs(ratio - 1) <= 0.15)  # fmt: skip


if __name__ == "__main__":
    main()
