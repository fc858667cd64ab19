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
from legato.serve.policies import EloraPolicy
from legato.serve.sim_study import Deployment, build_engine
from legato.serve.simulate import Arrival, arrivals_of, run
from legato.specs.registry import load_device, load_model

# Llama-2-7B on an A100 with a small pool (about 780 blocks) and 60 adapters, 3x over
# capacity: evictions of KV and adapters, preemptions, host KV swaps and prefix hits.
DIGESTS = {
    "vllm": "0e572ec25973d118c508395a62cfe29e394b6740f583ec2eba177b5a56ce1c7a",
    "slora": "d5cc7528b0b915ffe4106d4497e522e9d4d7069eee20db6fc52ec0df824c272a",
    "elora": "c276c8ee3bce84d672c209fbb39cb218b635618999ce1b7acdc4ac63c82f2088",
    "elora-lru": "39e9c6ddbe985eb4aa596fa423344b4476aad1027ba203a3df4acd6226ca3f0b",
    "elora-no-tree": "ac3133455d6c8856031781987493b14445344295555cd61af202fda3af41cdf6",
}
ABLATIONS = {"elora-lru": EloraPolicy(cost_model=False), "elora-no-tree": EloraPolicy(tree=False)}


def _arrivals(d: Deployment) -> list[Arrival]:
    stream = workload.synthetic(160, 30.0, 1.0, d.adapter_names(), 0.5, (8, 512), (8, 256))
    out = arrivals_of(stream, d.model.seq_len)
    for i in range(4, len(out), 5):  # a repeated prefix: found on the device or the host
        a, earlier = out[i], out[i - 4]
        prompt = earlier.prompt[:48] + a.prompt[:8]
        out[i] = Arrival(a.index, a.arrival_s, earlier.adapter, prompt, a.output_tokens)
    return out


def _log(policy) -> list[dict]:
    config = EngineConfig(policy=policy, max_num_seqs=64, max_num_batched_tokens=2048,
                          max_loras=8, swap_space=2**30)  # fmt: skip
    d = Deployment(load_model("llama2-7b"), load_device("a100-80g"), 60, (8, 64),
                   config=config, gpu_memory_utilization=0.3)  # fmt: skip
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
    records = _log(ABLATIONS.get(name, name))
    kinds = {k for r in records for k in r}
    assert {"admitted", "preempted", "load", "finished"} <= kinds  # a busy run
    assert digest(records) == DIGESTS[name]
