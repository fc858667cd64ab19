"""``legato serve simulate`` runs the engine's own scheduler and pool policy: given a real
run's arrivals, its measured step times and its link bandwidth, it makes the same decisions
step for step (and a run with one policy parameter changed does not)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from legato.data.tokenizer import ByteTokenizer
from legato.models import build_model
from legato.serve.clock import SimClock, WallClock
from legato.serve.decisions import DecisionLog, decisions
from legato.serve.engine import Engine, EngineConfig
from legato.serve.loading import generated_adapters
from legato.serve.policies import EloraPolicy
from legato.serve.simulate import (
    AdapterSize,
    Arrival,
    MeasuredSteps,
    SimTokenizer,
    SimulatedBackend,
    report,
    run,
)
from legato.specs.registry import load_model

CONFIG = dict(block_size=4, num_blocks=48, max_num_seqs=4, max_num_batched_tokens=24,
              link_gbps=2.0, swap_space=2**16)  # fmt: skip


@pytest.fixture(scope="module")
def real_run():
    """The tiny preset under ELORA with evictions, host KV and preemptions."""
    model = build_model(load_model("tiny").with_(num_layers=1), seed=0)
    adapters = generated_adapters(model, count=6, rank=4, seed=2)
    rng = np.random.default_rng(0)
    names, arrivals, t = list(adapters), [], 0.0
    for i in range(24):
        t += float(rng.exponential(0.004))
        prompt = [int(x) for x in rng.integers(1, 250, size=int(rng.integers(6, 30)))]
        if i % 5 == 4:  # a repeated prompt: a prefix found on the device or the host
            prompt = arrivals[i - 4].prompt[:12] + prompt[:4]
        adapter = names[int(rng.integers(0, len(names)))]
        arrivals.append(Arrival(i, t, adapter, prompt, int(rng.integers(2, 10))))
    log = DecisionLog()
    config = EngineConfig(policy="elora", **CONFIG)
    engine = Engine(model, ByteTokenizer(), adapters, config,
                    clock=WallClock(time.monotonic()), decision_log=log)  # fmt: skip
    requests, times, orphans = run(engine, arrivals)
    return engine, arrivals, log.records, report(engine, requests, times, orphans)


def _replay(real, arrivals, records, policy):
    clock, steps = SimClock(), MeasuredSteps(records)
    per_rank = real.backend.rank_elements(1)
    backend = SimulatedBackend(clock, steps, real.backend.block_bytes, real.max_model_len,
                               per_rank, real.backend.element_size)  # fmt: skip
    sizes = {n: AdapterSize(s.shape, s.numel) for n, s in real.memory.adapters.items()}
    log = DecisionLog()
    config = EngineConfig(policy=policy, **CONFIG)
    engine = Engine(backend, SimTokenizer(), sizes, config, clock=clock, decision_log=log)
    requests, times, orphans = run(engine, arrivals, steps)
    return log.records, report(engine, requests, times, orphans)


def test_the_simulation_makes_the_real_engines_decisions(real_run):
    real, arrivals, records, measured = real_run
    kinds = {k for r in records for k in r}
    assert {"admitted", "evict_kv", "load", "landed", "finished"} <= kinds  # a busy run
    simulated, figures = _replay(real, arrivals, records, "elora")
    assert decisions(simulated) == decisions(records)
    assert figures["mean_ttft_ms"] == pytest.approx(measured["mean_ttft_ms"], rel=1e-6)
    assert figures["completed"] == measured["completed"] == len(arrivals)


def test_a_changed_policy_parameter_decides_otherwise(real_run):
    real, arrivals, records, _ = real_run
    simulated, _ = _replay(real, arrivals, records, EloraPolicy(cost_model=False))
    assert decisions(simulated) != decisions(records)
