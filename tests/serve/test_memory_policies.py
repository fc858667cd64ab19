"""The device pool under random load, for each policy: accounting stays exact, nothing leaks
when requests finish or are aborted, and under ELORA no KV block is ever on the device
without its adapter — where vLLM's and S-LoRA's policies leave such blocks behind."""

from __future__ import annotations

import random

import pytest

from legato.data.tokenizer import ByteTokenizer
from legato.models import build_model
from legato.serve.engine import Engine, EngineConfig
from legato.serve.loading import generated_adapters
from legato.serve.sampling import SamplingParams
from legato.specs.registry import load_model


@pytest.fixture(scope="module")
def backbone():
    model = build_model(load_model("tiny").with_(num_layers=1), seed=0)
    return model, generated_adapters(model, count=6, rank=4, seed=2)


def _orphans(engine) -> int:
    """Cached KV blocks whose adapter is not on the device."""
    blocks, memory = engine.blocks, engine.memory
    return sum(
        1
        for b in range(blocks.num_blocks)
        if blocks.owner[b] is not None and memory.adapters[blocks.owner[b]].state != "resident"
    )


@pytest.mark.parametrize("policy", ["vllm", "slora", "elora"])
def test_random_load_keeps_the_pool_exact(backbone, policy):
    model, adapters = backbone
    config = EngineConfig(block_size=4, num_blocks=48, max_num_seqs=6, policy=policy,
                          max_loras=2, link_gbps=50.0)  # fmt: skip
    engine = Engine(model, ByteTokenizer(), adapters, config)
    rng = random.Random(0)
    names = list(adapters)
    live, orphans = [], 0
    for step in range(400):
        if step < 300 and rng.random() < 0.3:
            prompt = [rng.randrange(4) for _ in range(rng.randrange(3, 20))]  # shared prefixes
            params = SamplingParams(max_tokens=rng.randrange(1, 8), temperature=0, ignore_eos=True)
            live.append(engine.add(prompt, params, rng.choice(names)))
        if live and rng.random() < 0.05:
            engine.abort(live.pop(rng.randrange(len(live))))
        engine.step()
        engine.blocks.check()
        orphans = max(orphans, _orphans(engine))
        if policy == "elora":
            assert _orphans(engine) == 0
    while engine.has_work:
        engine.step()
    engine.blocks.check()
    assert engine.blocks.in_use == engine.memory.adapter_blocks()  # no KV block leaked
    assert all(s.pins == 0 for s in engine.memory.adapters.values())
    if policy != "elora":
        assert orphans > 0  # the waste ELORA's tree removes
