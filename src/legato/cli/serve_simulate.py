"""``legato serve simulate``: the engine's scheduler and pool policies on a modelled GPU
(``serve/simulate.py``, ``serve/sim_study.py``). A study of the pool policies at the scale
they were designed for, on a GPU's step costs as the device profile prices them — not a
claim about legato's own engine speed. Prints one JSON object per policy and rate (or per
policy with ``--find-capacity``); ``--plot FILE.png`` draws mean and p99 TTFT against the
request rate per policy."""

from __future__ import annotations

import argparse
import json
import math
import sys

from legato.errors import ConfigError
from legato.serve.policies import ABLATIONS, POLICIES

NOTE = "pool policies on a modelled GPU (device profile step costs), not legato's engine speed"


def register(serve_subparsers: argparse._SubParsersAction) -> None:
    p = serve_subparsers.add_parser("simulate", help="simulate multi-LoRA serving on a GPU")
    p.add_argument("--model", default="llama2-7b", help="a model preset or ModelSpec TOML")
    p.add_argument("--device", default="a100-80g", help="a device preset")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel devices per replica")
    p.add_argument("--num-adapters", type=int, default=100)
    p.add_argument("--adapter-rank", default="8", help="a rank, or ranks a,b,.. in turn")
    p.add_argument("--workload", default="slora",
                   help="slora (S-LoRA's generator), an Azure trace CSV, or a --request-log "
                   "JSONL of legato serve")  # fmt: skip
    p.add_argument("--alpha", type=float, default=1.0, help="adapter popularity (1: uniform)")
    p.add_argument("--cv", type=float, default=1.0, help="arrival coefficient of variation")
    p.add_argument("--rate", default="10", help="requests/s, or rates a,b,.. (slora)")
    p.add_argument("--duration", type=float, default=120.0, help="seconds of arrivals")
    p.add_argument("--rate-scale", type=float, default=1.0, help="trace arrivals sped up X")
    p.add_argument("--input-len", default="8:512", help="LO:HI prompt tokens (slora)")
    p.add_argument("--output-len", default="8:512", help="LO:HI output tokens (slora)")
    p.add_argument("--instruction-len", type=int, default=0, metavar="N",
                   help="tokens of each adapter's task instruction, before every prompt of "
                   "it (a prefix its cached KV blocks serve again; 0: none, as S-LoRA)")  # fmt: skip
    p.add_argument("--policy", action="append", choices=[*POLICIES, *ABLATIONS, "all"],
                   help="pool policy, or one of ELORA's ablations (repeatable; default "
                   "elora; all: the three policies)")  # fmt: skip
    p.add_argument("--max-loras", default="auto",
                   help="vllm: adapter slots, or auto: the best goodput of 1,2,4,..")  # fmt: skip
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=4096)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--slo-ttft-p99", type=float, default=None, metavar="S",
                   help="TTFT SLO in seconds: goodput's bound, --find-capacity's target")  # fmt: skip
    p.add_argument("--find-capacity", action="store_true",
                   help="the highest request rate whose p99 TTFT meets --slo-ttft-p99")  # fmt: skip
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="JSON only (no note on stderr)")
    p.add_argument("--plot", default=None, metavar="FILE.png", help="latency against load")
    p.set_defaults(func=_simulate)


def _span(text: str, flag: str) -> tuple[int, int]:
    try:
        lo, hi = (int(x) for x in text.split(":"))
    except ValueError:
        raise ConfigError(f"{flag}: expected LO:HI integers, got {text!r}") from None
    if not 1 <= lo <= hi:
        raise ConfigError(f"{flag}: must be LO:HI with 1 <= LO <= HI, got {text!r}")
    return lo, hi


def _numbers(text: str, flag: str, kind=float) -> list:
    try:
        values = [kind(x) for x in text.split(",")]
    except ValueError:
        raise ConfigError(f"{flag}: expected a number or a,b,.. numbers, got {text!r}") from None
    if not all(v > 0 and math.isfinite(v) for v in values):
        raise ConfigError(f"{flag}: must be > 0, got {text!r}")
    return values


def _arrivals_at(args, deployment):
    """rate -> the arrivals of the workload (the trace's own rate when it is a file)."""
    from legato.serve import workload
    from legato.serve.simulate import arrivals_of, slora_arrivals

    names, seq_len = deployment.adapter_names(), deployment.model.seq_len
    instruction = args.instruction_len
    if args.workload == "slora":
        inputs, outputs = (
            _span(args.input_len, "--input-len"),
            _span(args.output_len, "--output-len"),
        )
        if not args.cv > 0:
            raise ConfigError(f"--cv: must be > 0, got {args.cv}")

        def at(rate: float):
            return slora_arrivals(names, seq_len, rate, args.duration, args.cv, args.alpha,
                                  inputs, outputs, instruction, args.seed)  # fmt: skip

        return at
    if args.workload.endswith(".jsonl"):
        from legato.serve.request_log import read_request_log

        rows = read_request_log(args.workload)
        return lambda _rate: arrivals_of(rows, seq_len, instruction)
    if not args.rate_scale > 0:
        raise ConfigError(f"--rate-scale: must be > 0, got {args.rate_scale}")
    stream = workload.azure_trace(args.workload, None, names, args.alpha, args.rate_scale,
                                  max_prompt=seq_len - 1, seed=args.seed)  # fmt: skip
    cut = [r for r in stream if r.arrival_s < args.duration]
    return lambda _rate: arrivals_of(cut, seq_len, instruction)


def _simulate(args: argparse.Namespace, _extra: list[str]) -> int:
    from dataclasses import replace

    from legato.serve.engine import EngineConfig
    from legato.serve.sim_study import Deployment, best_max_loras, capacity, simulate
    from legato.specs.registry import load_device, load_model

    if args.instruction_len < 0:
        raise ConfigError(f"--instruction-len: must be >= 0, got {args.instruction_len}")
    for flag in ("tp", "num_adapters", "max_num_seqs", "max_num_batched_tokens", "block_size"):
        if getattr(args, flag) < 1:
            raise ConfigError(
                f"--{flag.replace('_', '-')}: must be >= 1, got {getattr(args, flag)}"
            )
    if args.find_capacity and args.slo_ttft_p99 is None:
        raise ConfigError("--find-capacity: needs --slo-ttft-p99 S")
    policies = args.policy or ["elora"]
    policies = list(POLICIES) if "all" in policies else list(dict.fromkeys(policies))
    ranks = _numbers(args.adapter_rank, "--adapter-rank", int)
    rates = _numbers(args.rate, "--rate")
    config = EngineConfig(block_size=args.block_size, max_num_seqs=args.max_num_seqs,
                          max_num_batched_tokens=args.max_num_batched_tokens)  # fmt: skip
    base = Deployment(load_model(args.model), load_device(args.device), args.num_adapters,
                      ranks, args.tp, config=config)  # fmt: skip
    arrivals_at = _arrivals_at(args, base)
    slo = args.slo_ttft_p99
    if not args.json:
        print(f"legato serve simulate: {NOTE}", file=sys.stderr)
    points = []
    for policy in policies:
        d = replace(base, config=replace(config, policy=policy))
        if args.find_capacity:
            result = capacity(d, arrivals_at, slo, _slots(args))
            print(json.dumps(result))
            continue
        for rate in rates:
            arrivals = arrivals_at(rate)
            result = _one(args, d, arrivals, slo, simulate, best_max_loras)
            result.update(rate=rate, note=NOTE)
            points.append(result)
            print(json.dumps(result))
    if args.plot and points:
        from legato.serve.sim_plot import plot_latency

        plot_latency(points, args.plot)
    return 0


def _slots(args) -> list[int] | None:
    """vllm's --max-loras candidates (auto: powers of two up to the adapters)."""
    if args.max_loras != "auto":
        return _numbers(args.max_loras, "--max-loras", int)[:1]
    return [2**i for i in range(12) if 2**i <= max(1, args.num_adapters)]


def _one(args, d, arrivals, slo, simulate, best_max_loras) -> dict:
    from dataclasses import replace

    slots = _slots(args)
    if d.config.policy != "vllm":
        return simulate(d, arrivals, slo)
    if len(slots) == 1:
        return simulate(replace(d, config=replace(d.config, max_loras=slots[0])), arrivals, slo)
    best, result, goodputs = best_max_loras(d, arrivals, slo if slo else 1e9, slots)
    result.update(max_loras=best, max_loras_goodput={str(k): v for k, v in goodputs.items()})
    return result
