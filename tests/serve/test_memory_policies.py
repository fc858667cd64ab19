"""The device pool under random load, for each policy: accounting stays exact, nothing leaks
when requests finish or are aborted, and under ELORA no KV block is ever on the device
without its adapter — where vLLM's and S-LoRA's policies leave such blocks behind."""

from __future__ import annotations

import random

import pytest

from legato.data.tokenizer import ByteTokenizer
from legato.errors import ConfigError
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


def _check_adapter_blocks_apart(engine) -> None:
    """An adapter's blocks (and vLLM's slot region) are never a request's KV or a cached
    block: a KV write into them would corrupt the LoRA the next step computes with."""
    blocks, memory = engine.blocks, engine.memory
    held = [b for s in memory.adapters.values() for b in s.blocks] + list(memory.region or ())
    assert len(held) == len(set(held))
    assert all(blocks.refs[b] == 1 and blocks.hash_of[b] is None for b in held)
    kv = {b for r in [*engine.running, *engine.waiting] for b in r.blocks} | set(blocks.idle)
    assert not kv & set(held)


@pytest.mark.parametrize("swap_space", [0, 2**20], ids=["no-host-kv", "host-kv"])
@pytest.mark.parametrize("policy", ["vllm", "slora", "elora"])
def test_random_load_keeps_the_pool_exact(backbone, policy, swap_space):
    model, adapters = backbone
    config = EngineConfig(block_size=4, num_blocks=48, max_num_seqs=6, policy=policy,
                          max_loras=2, link_gbps=50.0, swap_space=swap_space)  # fmt: skip
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
        _check_adapter_blocks_apart(engine)
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
    if swap_space:
        assert engine.memory.host_kv.hits > 0  # prefixes came back from the host


def _greedy(engine, adapter: str) -> list[int]:
    request = engine.add([1, 2, 3, 1, 2], SamplingParams(max_tokens=6, temperature=0), adapter)
    while engine.has_work:
        engine.step()
    return request.output


def test_vllm_slots_started_empty_take_adapters_up_to_max_lora_rank(backbone):
    """With no adapter at start, vLLM's slots are sized by --max-lora-rank; without it the
    engine refuses to start instead of refusing every later load."""
    model, adapters = backbone
    with pytest.raises(ConfigError, match="--max-lora-rank"):
        Engine(model, ByteTokenizer(), {}, EngineConfig(num_blocks=64, policy="vllm"))
    config = EngineConfig(block_size=4, num_blocks=128, policy="vllm", max_loras=2, max_lora_rank=4)
    engine = Engine(model, ByteTokenizer(), {}, config)
    engine.load_adapter("lora-0", adapters["lora-0"])  # rank 4 on q, k, v, o: fits a slot
    given = Engine(model, ByteTokenizer(), {"lora-0": adapters["lora-0"]},
                   EngineConfig(block_size=4, num_blocks=128, policy="vllm", max_loras=2))  # fmt: skip
    assert _greedy(engine, "lora-0") == _greedy(given, "lora-0")
    assert engine.memory.slot_blocks > given.memory.slot_blocks  # room for every layer


def test_a_request_aborted_while_its_prefix_comes_back_loses_nothing(backbone):
    """The copy finishes before the blocks are let go (never into a reused block), and the
    blocks that came are cached on the device: the next request finds them there."""
    model, _ = backbone
    config = EngineConfig(
        block_size=4, num_blocks=16, policy="slora", link_gbps=0.0005, swap_space=2**20
    )  # 62.5 KB/s: three 2 KB blocks take ~0.1 s
    engine = Engine(model, ByteTokenizer(), {}, config)
    params = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
    prefix = list(range(1, 13))  # three blocks
    engine.generate([[*prefix, 1]], params, [None])
    engine.generate([[2] * 60 + [3]], params, [None])  # needs all 16 blocks: the prefix leaves
    assert len(engine.memory.host_kv.blocks) >= 3
    again = engine.add([*prefix, 2], params, None)
    engine.step()
    assert again.kv_load is not None and not again.kv_load.done  # on its way in
    engine.abort(again)
    engine.blocks.check()
    assert engine.blocks.in_use == 0
    hits = engine.blocks.hits
    (last,) = engine.generate([[*prefix, 3]], params, [None])
    assert engine.blocks.hits == hits + 3 and last.cached >= 12  # found on the device


@pytest.mark.parametrize("policy", ["vllm", "elora"])
def test_max_cpu_loras_keeps_that_many_host_copies_and_reads_the_rest_from_disk(
    backbone, policy, tmp_path
):
    """vLLM's --max-cpu-loras: adapters with a PEFT folder beyond the bound lose their host
    copy (least recently used first, never one on the device or on its way) and are read
    back from disk when next needed — with the same answers as an engine holding them all."""
    from legato.lora.peft_io import save_adapter

    model, adapters = backbone
    folders = {}
    for name, adapter in adapters.items():
        folders[name] = save_adapter(adapter, tmp_path / name, "tiny")
    config = EngineConfig(block_size=4, num_blocks=64, max_num_seqs=2, policy=policy,
                          max_loras=1, link_gbps=50.0, max_cpu_loras=2)  # fmt: skip
    bounded = Engine(model, ByteTokenizer(), adapters, config, sources=folders)
    assert bounded.memory.host_copies() == 2
    free = Engine(model, ByteTokenizer(), adapters, EngineConfig(block_size=4, num_blocks=64))
    names = list(adapters) * 2
    params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    for engine in (bounded, free):
        requests = [engine.add([1, 2, 3, i % 4], params, name) for i, name in enumerate(names)]
        while engine.has_work:
            engine.step()
            if engine is bounded:
                on_device = sum(s.state != "host" for s in engine.memory.adapters.values())
                assert engine.memory.host_copies() <= max(2, on_device)
        engine.outputs = [r.output for r in requests]
    assert bounded.outputs == free.outputs
    # all but the two host copies kept at start had to come back from disk
    assert bounded.memory.disk_reads() >= len(adapters) - 2 and free.memory.disk_reads() == 0
    with pytest.raises(ConfigError, match="--max-cpu-loras: must be >= --max-loras"):
        Engine(model, ByteTokenizer(), adapters,
               EngineConfig(policy="vllm", max_loras=3, max_cpu_loras=2), sources=folders)  # fmt: skip


def test_an_adapter_whose_folder_is_gone_fails_its_requests_only(backbone, tmp_path):
    import shutil

    from legato.lora.peft_io import save_adapter

    model, adapters = backbone
    folders = {n: save_adapter(a, tmp_path / n, "tiny") for n, a in adapters.items()}
    config = EngineConfig(block_size=4, num_blocks=64, policy="slora", link_gbps=50.0,
                          max_cpu_loras=1)  # fmt: skip
    engine = Engine(model, ByteTokenizer(), adapters, config, sources=folders)
    gone = next(n for n, s in engine.memory.adapters.items() if s.host is None)
    shutil.rmtree(folders[gone])
    params = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
    other = next(n for n in adapters if n != gone)
    failed, fine = engine.generate([[1, 2, 3], [1, 2, 3]], params, [gone, other])
    assert failed.finish_reason == "abort" and "cannot read adapter" in failed.error
    assert fine.error is None and len(fine.output) == 3
    engine.blocks.check()
    assert engine.blocks.in_use == engine.memory.adapter_blocks()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # planted
def test_a_copy_thread_that_died_is_an_error_not_a_hang(backbone, monkeypatch):
    """Waiting for a copy the copy thread will never finish (it died on a bug) raises
    instead of spinning forever."""
    model, adapters = backbone
    engine = Engine(model, ByteTokenizer(), adapters,
                    EngineConfig(block_size=4, num_blocks=64, policy="slora"))  # fmt: skip
    slot = next(s for s in engine.memory.adapters.values() if s.state == "host")
    monkeypatch.setattr(type(slot), "copy_into", lambda self, pool: 1 / 0)
    slot.state = "loading"  # as a load leaves it, its copy queued
    engine.memory._copies.put(slot)
    with pytest.raises(RuntimeError, match="the copy thread died"):
        engine.memory.wait(slot, timeout_s=60)
