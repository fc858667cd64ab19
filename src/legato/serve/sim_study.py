"""A multi-LoRA deployment on a modelled GPU, as ``legato serve simulate`` and
``benchmarks/serving_at_scale.py`` ask about it: the engine of a model with N adapters on a
device (``build_engine``), one run (``simulate``), the highest request rate that meets a
p99 TTFT SLO (``find_capacity``, Vidur-Search's question; ``capacity`` for any policy, vLLM's
with its ``--max-loras`` tuned) and vLLM's ``--max-loras`` tuned per case
(``best_max_loras``).

Sizes follow vLLM: the device's memory times ``gpu_memory_utilization``, less the weights
(split over ``tp``) and an activation reserve, is the pool, in blocks of ``block_size``
tokens of keys and values; an adapter on ``targets`` is cut into blocks of the same bytes
(split over ``tp`` as its layers are). The host link is the profile's measured
host-to-device bandwidth.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from legato.devices import profile_for
from legato.errors import ConfigError
from legato.lora.adapter import AdapterShape
from legato.serve.clock import SimClock
from legato.serve.engine import Engine, EngineConfig
from legato.serve.simulate import (
    AdapterSize,
    Arrival,
    PredictedSteps,
    SimTokenizer,
    SimulatedBackend,
    report,
    run,
)
from legato.serve.step_time import StepTimeModel
from legato.specs.device import DeviceSpec
from legato.specs.model import ModelSpec
from legato.specs.params import count_params

ACTIVATION_RESERVE = 0.05  # of device memory, for activations and the sampler (vLLM's profile run)
LINEARS = ("q", "k", "v", "o", "gate", "up", "down")
BYTES = 2  # fp16 weights, KV and adapters


@dataclass
class Deployment:
    """What is simulated: ``model`` on ``tp`` devices of ``device`` serving
    ``num_adapters`` adapters of ``ranks`` (adapter i has ``ranks[i % len(ranks)]``)."""

    model: ModelSpec
    device: DeviceSpec
    num_adapters: int
    ranks: Sequence[int] = (8,)
    tp: int = 1
    targets: Sequence[str] = ("q", "k", "v", "o")
    config: EngineConfig = field(default_factory=EngineConfig)
    gpu_memory_utilization: float = 0.9

    def adapter_names(self) -> list[str]:
        return [f"lora-{i}" for i in range(self.num_adapters)]


def _dims(model: ModelSpec) -> dict[str, tuple[int, int]]:
    h, hd, ffn = model.hidden_size, model.head_dim, model.ffn_hidden_size
    return {"q": (h, model.num_heads * hd), "k": (h, model.num_kv_heads * hd),
            "v": (h, model.num_kv_heads * hd), "o": (model.num_heads * hd, h),
            "gate": (h, ffn), "up": (h, ffn), "down": (ffn, h)}  # fmt: skip


def _per_rank(model: ModelSpec, targets: Sequence[str], tp: int) -> int:
    """Elements per unit of rank of an adapter on ``targets`` of every layer, per device."""
    dims = _dims(model)
    return model.num_layers * sum(sum(dims[t]) for t in targets) // tp


def block_bytes(d: Deployment) -> int:
    """Bytes of one KV block on one device: keys and values of every layer."""
    m = d.model
    return 2 * m.num_layers * (m.num_kv_heads // d.tp) * m.head_dim * BYTES * d.config.block_size


def sized_config(d: Deployment) -> EngineConfig:
    """``d.config`` with the pool's blocks and the link from the device (module docstring)."""
    m = d.model
    memory = d.device.memory_bytes * (d.gpu_memory_utilization - ACTIVATION_RESERVE)
    free = memory - count_params(m).total * BYTES / d.tp
    blocks = int(free // block_bytes(d))
    if blocks < 2:
        raise ConfigError(
            f"--tp: {m.name} does not fit {d.device.name} x {d.tp} (weights take the memory)"
        )
    link = profile_for(d.device).host_link.host_to_device_gbs * 8
    return replace(d.config, num_blocks=blocks, link_gbps=link, max_queue=10**9)


def build_engine(d: Deployment, steps=None, clock=None, decision_log=None) -> Engine:
    """The engine of ``d`` on a ``SimClock``, steps priced by the device (or ``steps``)."""
    clock = clock or SimClock()
    if steps is None:
        profile = profile_for(d.device)
        steps = PredictedSteps(StepTimeModel(d.model, d.device, profile, d.tp, d.targets).step_time)
    config = sized_config(d)
    m = d.model
    backend = SimulatedBackend(clock, steps, block_bytes(d), m.seq_len,
                               _per_rank(m, LINEARS, d.tp), BYTES)  # fmt: skip
    per_rank = _per_rank(m, d.targets, d.tp)
    adapters = {}
    for i, name in enumerate(d.adapter_names()):
        rank = d.ranks[i % len(d.ranks)]
        shape = AdapterShape(rank, 2.0 * rank, 0.0, tuple(d.targets))
        adapters[name] = AdapterSize(shape, rank * per_rank)
    if config.max_lora_rank == 0:
        config = replace(config, max_lora_rank=max(d.ranks))
    return Engine(backend, SimTokenizer(), adapters, config, model_name=m.name,
                  clock=clock, decision_log=decision_log)  # fmt: skip


def simulate(d: Deployment, arrivals: Sequence[Arrival], slo_ttft_s: float | None = None,
             slo_tpot_s: float | None = None, stop=None) -> dict | None:  # fmt: skip
    """One run of ``arrivals``: ``legato bench serve``'s figures and the pool's (None if
    ``stop``, ``simulate.run``'s, ended it early)."""
    engine = build_engine(d)
    requests, times, orphans = run(engine, arrivals, stop=stop)
    if len(requests) < len(arrivals) or engine.has_work:
        return None
    result = report(engine, requests, times, orphans, slo_ttft_s, slo_tpot_s)
    result["policy"] = engine.policy.name
    result["num_blocks"] = engine.config.num_blocks
    return result


def meets_p99_ttft(d: Deployment, arrivals: Sequence[Arrival], slo_ttft_p99_s: float):
    """The run's figures if its p99 TTFT meets the SLO, else None — known, and the run
    stopped, as soon as more requests have waited past the SLO than the p99 tolerates (an
    overloaded run would otherwise simulate its whole queue only to fail)."""
    n = len(arrivals)
    # numpy's p99 lies at or above the sorted TTFTs' element floor(0.99 (n - 1)): once
    # n - floor(0.99 (n - 1)) of them exceed the SLO, so does the p99
    allowed = n - math.floor(0.99 * (n - 1)) - 1

    def hopeless(requests, now: float) -> bool:
        late = sum(1 for r in requests if (now if r.first_token_s is None else r.first_token_s)
                   - r.arrival_s > slo_ttft_p99_s)  # fmt: skip
        return late > allowed

    result = simulate(d, arrivals, slo_ttft_p99_s, stop=hopeless)
    return result if result and result["p99_ttft_ms"] <= slo_ttft_p99_s * 1e3 else None


def find_capacity(
    d: Deployment,
    arrivals_at: Callable[[float], Sequence[Arrival]],
    slo_ttft_p99_s: float,
    low: float = 0.25,
    high: float = 64.0,
    rounds: int = 7,
) -> tuple[float, dict | None]:
    """The highest rate (requests/s, by bisection between ``low`` and ``high`` on a log
    scale) whose run keeps p99 TTFT within the SLO, and that run (0 and None if even
    ``low`` misses it)."""
    best, best_run = 0.0, None
    for _ in range(rounds):
        rate = (low * high) ** 0.5
        result = meets_p99_ttft(d, arrivals_at(rate), slo_ttft_p99_s)
        if result is not None:
            best, best_run, low = rate, result, rate
        else:
            high = rate
    return best, best_run


def _each_slot_count(d: Deployment, candidates: Sequence[int], measure: Callable) -> dict:
    """``measure(case)`` of ``d`` under vLLM with each ``--max-loras`` of ``candidates`` in
    turn, until one leaves no KV blocks (more slots would leave fewer)."""
    out = {}
    for slots in candidates:
        case = replace(d, config=replace(d.config, policy="vllm", max_loras=slots))
        try:
            out[slots] = measure(case)
        except ConfigError:  # the slots leave no KV blocks
            break
    if not out:
        raise ConfigError("--max-loras: no slot count leaves room for KV blocks")
    return out


def best_max_loras(
    d: Deployment, arrivals: Sequence[Arrival], slo_ttft_s: float, candidates: Sequence[int]
) -> tuple[int, dict, dict[int, float]]:
    """vLLM's ``--max-loras`` giving the best goodput under the TTFT SLO, searched over
    ``candidates`` (those whose slots leave KV room); the value, its run, and every
    candidate's goodput."""
    runs = _each_slot_count(d, candidates, lambda case: simulate(case, arrivals, slo_ttft_s))
    goodputs = {slots: run["request_goodput"] for slots, run in runs.items()}
    best = max(goodputs, key=lambda s: (goodputs[s], -s))
    return best, runs[best], goodputs


def capacity(
    d: Deployment,
    arrivals_at: Callable[[float], Sequence[Arrival]],
    slo_ttft_p99_s: float,
    slots: Sequence[int] = (),
    **search,
) -> dict:
    """``find_capacity`` of ``d`` (``search``: its ``low``, ``high``, ``rounds``); under
    the vllm policy, of each ``--max-loras`` in ``slots`` (those that leave KV blocks), the
    best kept — vLLM as a tuned baseline. The rate, the run at it and, for vllm, the slots
    chosen and each candidate's capacity."""
    if d.config.policy != "vllm" or not slots:
        rate, at = find_capacity(d, arrivals_at, slo_ttft_p99_s, **search)
        return {"policy": d.config.policy, "capacity_rps": rate, "at_capacity": at}
    found = _each_slot_count(
        d, slots, lambda case: find_capacity(case, arrivals_at, slo_ttft_p99_s, **search)
    )
    best = max(found, key=lambda n: (found[n][0], -n))
    return {"policy": "vllm", "capacity_rps": found[best][0], "max_loras": best,
            "capacity_by_max_loras": {str(n): rate for n, (rate, _) in found.items()},
            "at_capacity": found[best][1]}  # fmt: skip
