"""Multi-LoRA pool policies at the scale they were designed for, on a modelled GPU
(``legato serve simulate``: the engine's own scheduler and policies, step times from the
device profile). A study of the pool policies, not of legato's own engine speed.

Two claims, one JSON line each case:

- ``sim_speed``: simulating the S-LoRA workload at 80 req/s for 125 s (about 10,000
  requests; Llama-2-7B, A100-80GB, 1,000 rank-8 adapters, ``slora``) — wall seconds
  against the 60 s budget (lower is better).
- ``policy``: mean TTFT of each policy against vLLM's (ratio = policy / vllm, lower is
  better), vLLM's ``--max-loras`` tuned per case as the best goodput (TTFT <= the SLO) over
  1, 4, 16, 64 slots; ELORA's ablation as ``elora-no-tree`` and ``elora-lru``. Default: a
  short grid (Llama-2-7B on A100-80GB, 100 and 1,000 adapters, ranks 8 and 64, alpha 0.1
  and 1, cv 1, 20 s of arrivals); ``--full`` adds Llama-2-13B and Llama-3-8B, H100, 2,000
  adapters and cv 4; ``--quick`` one case and no speed run.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from dataclasses import replace

from legato.serve import workload
from legato.serve.engine import EngineConfig
from legato.serve.policies import EloraPolicy
from legato.serve.sim_study import Deployment, best_max_loras, simulate
from legato.serve.simulate import arrivals_of
from legato.specs.registry import load_device, load_model

SLO_TTFT_S = 0.5  # ELORA's peak-load criterion
SLOTS = (1, 4, 16, 64)


def _arrivals(d: Deployment, rate: float, duration: float, alpha: float, cv: float):
    n = int(rate * duration * 1.5) + 10
    stream = workload.synthetic(n, rate, 1 / cv**2, d.adapter_names(), alpha, (8, 512), (8, 512))
    return arrivals_of([r for r in stream if r.arrival_s < duration], d.model.seq_len)


def sim_speed() -> dict:
    d = Deployment(load_model("llama2-7b"), load_device("a100-80g"), 1000, (8,),
                   config=EngineConfig(policy="slora", max_num_seqs=256,
                                       max_num_batched_tokens=4096))  # fmt: skip
    arrivals = _arrivals(d, 80.0, 125.0, 1.0, 1.0)
    began = time.perf_counter()
    result = simulate(d, arrivals)
    seconds = time.perf_counter() - began
    return {"benchmark": "serving_at_scale", "case": {"claim": "sim_speed",
            "requests": len(arrivals), "completed": result["completed"]},
            "metric": "wall_s", "value": seconds, "baseline": "budget_60s",
            "baseline_value": 60.0, "ratio": seconds / 60.0}  # fmt: skip


def policy_cases(full: bool, quick: bool):
    models = ["llama2-7b", "llama2-13b", "llama3-8b"] if full else ["llama2-7b"]
    devices = ["a100-80g", "h100"] if full else ["a100-80g"]
    counts = [100, 1000, 2000] if full else [100, 1000]
    ranks, alphas, cvs = [8, 64], [0.1, 1.0], ([1.0, 4.0] if full else [1.0])
    grid = itertools.product(models, devices, counts, ranks, alphas, cvs)
    return list(grid)[:1] if quick else list(grid)


def policy_rows(case, rate: float, duration: float) -> list[dict]:
    model, device, count, rank, alpha, cv = case
    config = EngineConfig(max_num_seqs=256, max_num_batched_tokens=4096)
    base = Deployment(load_model(model), load_device(device), count, (rank,), config=config)
    arrivals = _arrivals(base, rate, duration, alpha, cv)
    slots, vllm, _ = best_max_loras(base, arrivals, SLO_TTFT_S, SLOTS)
    rows = []
    policies = {"slora": "slora", "elora": "elora",
                "elora-no-tree": EloraPolicy(tree=False),
                "elora-lru": EloraPolicy(cost_model=False)}  # fmt: skip
    for name, policy in policies.items():
        result = simulate(replace(base, config=replace(config, policy=policy)), arrivals,
                          SLO_TTFT_S)  # fmt: skip
        for metric in ("mean_ttft_ms", "mean_tpot_ms", "request_goodput"):
            rows.append({"benchmark": "serving_at_scale", "case": {
                "model": model, "device": device, "adapters": count, "rank": rank,
                "alpha": alpha, "cv": cv, "rate": rate, "policy": name,
                "vllm_max_loras": slots, "kv_without_adapter": result["kv_without_adapter"],
                "adapter_loads_per_request": result["adapter_loads_per_request"]},
                "metric": metric, "value": result[metric], "baseline": "vllm",
                "baseline_value": vllm[metric],
                "ratio": result[metric] / vllm[metric] if vllm[metric] else None})  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one policy case, no speed run")
    parser.add_argument("--full", action="store_true", help="the whole study grid")
    parser.add_argument("--rate", type=float, default=6.0, help="requests/s of the study")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of arrivals")
    args = parser.parse_args()
    for case in policy_cases(args.full, args.quick):
        for row in policy_rows(case, args.rate, args.duration):
            print(json.dumps(row), flush=True)
    if not args.quick:
        print(json.dumps(sim_speed()), flush=True)


if __name__ == "__main__":
    main()
