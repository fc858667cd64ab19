"""``legato serve simulate`` with predicted step times against a real run (tiny preset, CPU).

The real engine serves one workload (S-LoRA's generator: Gamma arrivals, power-law adapter
popularity, uniform lengths; each adapter's prompts start with its own instruction, the
prefix its KV blocks cache) in wall-clock time. A step-time model (``serve/step_fit.py``:
seconds per step, per request, per new token, per attended position, per adapter) prices
the steps, and the simulator runs the same arrivals on the same engine configuration with
those predicted step times: its schedule diverges from the real one as soon as one step
is priced differently, so what is compared is the simulator's queueing and batching
driven by a five-coefficient law, not a replay. Two fits, a row each:

- ``fit=same_run``: the law fitted on the compared run's own steps (five coefficients over
  ~2,000 steps: the law cannot memorise them). This is the simulator's fidelity.
- ``fit=other_run``: fitted on a *different* run (another seed and rate). On this shared
  machine two runs a minute apart differ in speed by up to ~20% (``machine_drift``: the
  compared run's measured step seconds over what the other run's law predicts for the
  same batches), which this row carries on top of the simulator's own error.

Ratios are simulated / real (the goal: within 15%), medians over ``--repeats`` pairs.

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
    """One compared run (seed of this ``repeat``) simulated under its own law and under
    the law of another run: the figures of each."""
    names = list(adapters)
    fit_arrivals = workload(names, args.num_prompts, args.fit_rate, seed=1 + 2 * repeat)
    _, fit_records, _ = real_run(model, adapters, fit_arrivals)
    other = LinearStepTime.fit(logged_batches(fit_records, adapters_by_seq(fit_arrivals)))
    arrivals = workload(names, args.num_prompts, args.rate, seed=2 + 2 * repeat)
    real, records, measured = real_run(model, adapters, arrivals)
    steps = logged_batches(records, adapters_by_seq(arrivals))
    same = LinearStepTime.fit(steps)
    out = {"real": measured}
    for fit, law in (("same_run", same), ("other_run", other)):
        errors = [abs(law.step_time(rows) / seconds - 1) for rows, seconds in steps if seconds]
        predicted = sum(law.step_time(rows) for rows, _ in steps)
        simulated = simulated_run(real, arrivals, law.step_time)
        out[fit] = {"simulated": simulated, "error": statistics.median(errors),
                    "drift": sum(seconds for _, seconds in steps) / predicted}  # fmt: skip
        note(BENCHMARK, repeat=repeat, fit=fit, fitted_seconds_per=law.as_dict(),
             step_time_median_abs_error=out[fit]["error"], machine_drift=out[fit]["drift"],
             **{f"{m}_{k}": v[m] for m in ("mean_ttft_ms", "mean_tpot_ms")
                for k, v in (("real", measured), ("simulated", simulated))})  # fmt: skip
    return out


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
    for fit in ("same_run", "other_run"):
        case = {"model": "tiny", "rate": args.rate, "fit": fit, "requests": args.num_prompts,
                "policy": CONFIG["policy"], "repeats": args.repeats}  # fmt: skip
        if fit == "other_run":
            case["fit_rate"] = args.fit_rate
        emit(BENCHMARK, case, "step_time_median_abs_error",
             statistics.median(p[fit]["error"] for p in pairs), digits=4,
             machine_drift=[round(p[fit]["drift"], 3) for p in pairs])  # fmt: skip
        for metric in ("mean_ttft_ms", "mean_tpot_ms"):
            ratios = [p[fit]["simulated"][metric] / p["real"][metric] for p in pairs]
            k = ratios.index(statistics.median_low(ratios))
            emit(BENCHMARK, case, metric, pairs[k][fit]["simulated"][metric], "real_run",
                 pairs[k]["real"][metric], digits=3, ratio=ratios[k], ratio_digits=3,
                 ratios=[round(r, 3) for r in ratios],
                 within_15pct=abs(ratios[k] - 1) <= 0.15)  # fmt: skip


if __name__ == "__main__":
    main()
