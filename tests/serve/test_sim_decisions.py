"""The simulator's speed-ups (incremental counts, heaps, identity comparisons) must not
change one decision: a fixed overloaded simulation under every policy writes exactly the
decision log it wrote before them, pinned here by its digest. A change that means to
decide otherwise updates the digest and says why in its commit."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace

import pytest

from legato.serve import workload
from legato.serve.clock import SimClock
from legato.serve.decisions import DecisionLog, decisions
from legato.serve.engine import EngineConfig
from legato.serve.sim_study import Deployment, build_engine, meets_p99_ttft, simulate
from legato.serve.simulate import Arrival, arrivals_of, pool_figures, run
from legato.specs.registry import load_device, load_model

# Llama-2-7B on an A100 with a small pool (about 780 blocks) and 60 adapters, 3x over
# capacity: evictions of KV and adapters, preemptions, host KV swaps and prefix hits.
DIGESTS = {
    "vllm": "0e572ec25973d118c508395a62cfe29e394b6740f583ec2eba177b5a56ce1c7a",
    "slora": "d5cc7528b0b915ffe4106d4497e522e9d4d7069eee20db6fc52ec0df824c272a",
    "elora": "f106e6aefcde2ff5e24b1b4ece2095bcc0d6e991a82acd802e04e4a357729f45",
    "elora-lru": "39e9c6ddbe985eb4aa596fa423344b4476aad1027ba203a3df4acd6226ca3f0b",
    "elora-no-tree": "e9d3f0a7b1452cf9370c3149b937ac74c6b3918107278d17a014c6a83fb5405f",
}


def _arrivals(d: Deployment) -> list[Arrival]:
    stream = workload.synthetic(160, 30.0, 1.0, d.adapter_names(), 0.5, (8, 512), (8, 256))
    out = arrivals_of(stream, d.model.seq_len)
    for i in range(4, len(out), 5):  # a repeated prefix: found on the device or the host
        a, earlier = out[i], out[i - 4]
        prompt = earlier.prompt[:48] + a.prompt[:8]
        out[i] = Arrival(a.index, a.arrival_s, earlier.adapter, prompt, a.output_tokens)
    return out


def _busy(policy) -> Deployment:
    """The fixed overloaded deployment (see ``DIGESTS``) under ``policy``."""
    config = EngineConfig(policy=policy, max_num_seqs=64, max_num_batched_tokens=2048,
                          max_loras=8, swap_space=2**30)  # fmt: skip
    return Deployment(load_model("llama2-7b"), load_device("a100-80g"), 60, (8, 64),
                      config=config, gpu_memory_utilization=0.3)  # fmt: skip


def _log(policy) -> list[dict]:
    d = _busy(policy)
    log = DecisionLog()
    engine = build_engine(d, clock=SimClock(), decision_log=log)
    run(engine, _arrivals(replace(d)))
    return log.records


def digest(records: list[dict]) -> str:
    """The decisions (and the step times: a predicted run is a function of them) hashed."""
    text = json.dumps([decisions(records), [r["t"] for r in records]])
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.mark.parametrize("name", list(DIGESTS))
def test_a_fixed_simulation_decides_as_pinned(name):
    records = _log(name)
    kinds = {k for r in records for k in r}
    assert {"admitted", "preempted", "load", "finished"} <= kinds  # a busy run
    assert digest(records) == DIGESTS[name]


def test_the_kv_hit_rate_is_a_share_of_the_blocks_looked_up():
    """Preempted requests look their blocks up again: hits are counted against every
    lookup, so the rate stays a rate (it was hits over prompt blocks, above 1 under load)."""
    d = _busy("elora")
    engine = build_engine(d, clock=SimClock())
    requests, _, orphans = run(engine, _arrivals(d))
    figures = pool_figures(engine, requests, orphans)
    assert sum(r.preemptions for r in requests) > 0
    found = engine.blocks.hits + engine.memory.host_kv.hits
    assert figures["kv_hit_rate"] == found / engine.blocks.asked
    assert 0 < figures["kv_hit_rate"] <= 1


def test_a_task_instruction_is_a_prefix_each_adapter_finds_again():
    """With ``instruction_len`` every prompt of an adapter begins with the same tokens, so
    later requests of an adapter find its blocks; without, no two prompts share a block."""
    d = Deployment(load_model("llama2-7b"), load_device("a100-80g"), 2, (8,),
                   config=EngineConfig(policy="elora"))  # fmt: skip
    stream = workload.synthetic(40, 2.0, 1.0, d.adapter_names(), 1.0, (8, 64), (8, 16))
    plain, taught = arrivals_of(stream, 4096), arrivals_of(stream, 4096, 64)
    for a, b in zip(plain, taught, strict=True):
        assert len(b.prompt) == len(a.prompt) + 64 and b.prompt[64:] == a.prompt
    assert len({tuple(a.prompt[:64]) for a in taught}) == 1
    assert len({a.prompt[0] for a in plain}) == len(plain)
    hits = {}
    for name, arrivals in (("plain", plain), ("taught", taught)):
        engine = build_engine(d, clock=SimClock())
        run(engine, arrivals)
        hits[name] = engine.blocks.hits
    assert hits["plain"] == 0 and hits["taught"] >= 4 * (len(taught) - 2)


def test_a_capacity_probe_stopped_early_decides_as_the_whole_run():
    """``meets_p99_ttft`` stops a run once its p99 TTFT cannot meet the SLO: at every rate,
    under load and over it, its verdict is the whole run's."""
    d = Deployment(load_model("llama2-7b"), load_device("a100-80g"), 60, (8,),
                   config=EngineConfig(policy="slora", max_num_seqs=64,
                                       max_num_batched_tokens=2048),
                   gpu_memory_utilization=0.3)  # fmt: skip
    verdicts = []
    for rate in (1.0, 4.0, 16.0, 64.0):
        stream = workload.synthetic(int(rate * 20) + 5, rate, 1.0, d.adapter_names(), 1.0,
                                    (8, 512), (8, 256))  # fmt: skip
        arrivals = arrivals_of(stream, d.model.seq_len)
        whole = simulate(d, arrivals, 0.5)
        probe = meets_p99_ttft(d, arrivals, 0.5)
        verdicts.append(whole["p99_ttft_ms"] <= 500)
        assert (probe is not None) == verdicts[-1]
        if probe is not None:
            assert probe == whole
    assert True in verdicts and False in verdicts


def test_elora_keeps_the_adapters_the_mix_asks_for_over_kv_no_prompt_shares():
    """On S-LoRA's workload no prompt shares a block with another (nothing is ever found
    again), so a cached KV block is worth nothing and an adapter of the recent mix is worth
    its copy: ELORA's cost model evicts KV first and reloads fewer adapters than S-LoRA's
    LRU, which evicts idle adapters for those dead blocks."""
    config = EngineConfig(max_num_seqs=64, max_num_batched_tokens=2048)
    d = Deployment(load_model("llama2-7b"), load_device("a100-80g"), 200, (8,),
                   config=config, gpu_memory_utilization=0.3)  # fmt: skip
    stream = workload.synthetic(300, 4.0, 1.0, d.adapter_names(), 1.0, (8, 512), (8, 256))
    arrivals = arrivals_of(stream, d.model.seq_len)
    evicted, loads = {}, {}
    for name in ("slora", "elora"):
        log = DecisionLog()
        case = replace(d, config=replace(config, policy=name))
        engine = build_engine(case, clock=SimClock(), decision_log=log)
        run(engine, arrivals)
        assert engine.blocks.hits == 0 and any("evict_kv" in r for r in log.records)
        evicted[name] = sum(len(r.get("evict_adapter", [])) for r in log.records)
        loads[name] = engine.memory.loads
    assert evicted["elora"] == 0 < evicted["slora"]
    assert loads["elora"] < loads["slora"]
