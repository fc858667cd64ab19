"""The engine's greedy tokens equal Hugging Face transformers + PEFT on the same weights, token
for token (fp32): each adapter alone, all adapters mixed in one batch, and under a cache so
small that requests are preempted, recomputed and hit the prefix cache."""

from __future__ import annotations

import pytest
import torch

from legato.data.tokenizer import ByteTokenizer
from legato.lora.peft_io import save_adapter
from legato.models import build_model
from legato.models.hf_checkpoint import save_safetensors
from legato.serve.engine import Engine, EngineConfig
from legato.serve.loading import generated_adapters
from legato.serve.sampling import SamplingParams
from legato.specs.registry import load_model

PROMPTS = ["The cat sat on", "Once upon a time there was a", "abcabcabcabcabcabc", "Q:"]
NEW_TOKENS = 10


pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")  # peft on transformers 5


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A tiny Llama, three generated adapters (one also on the MLP and LM head), and the
    greedy continuations HF + PEFT gives for each (adapter, prompt)."""
    peft = pytest.importorskip("peft")
    from transformers import LlamaForCausalLM

    from legato.lora.hf_interop import llama_config

    folder = tmp_path_factory.mktemp("served")
    spec = load_model("tiny").with_(num_layers=2)
    model = build_model(spec, seed=0)
    adapters = generated_adapters(model, count=3, rank=4, seed=1)
    save_safetensors(model, folder / "base")
    llama_config(spec).save_pretrained(folder / "base")
    tokenizer = ByteTokenizer()
    suppressed = list(range(tokenizer.vocab_size, spec.vocab_size))
    expected = {}
    for name, adapter in [(None, None), *adapters.items()]:
        hf = LlamaForCausalLM.from_pretrained(folder / "base", dtype=torch.float32).eval()
        if adapter is not None:
            save_adapter(adapter, folder / name, str(folder / "base"))
            hf = peft.PeftModel.from_pretrained(hf, folder / name).eval()
        for prompt in PROMPTS:
            ids = torch.tensor([tokenizer.encode(prompt)])
            with torch.no_grad():
                out = hf.generate(input_ids=ids, max_new_tokens=NEW_TOKENS, do_sample=False,
                                  suppress_tokens=suppressed, eos_token_id=None, pad_token_id=0)  # fmt: skip
            expected[(name, prompt)] = out[0, ids.shape[1] :].tolist()
    return model, adapters, tokenizer, expected


def _run(served, config, pairs):
    model, adapters, tokenizer, expected = served
    engine = Engine(model, tokenizer, adapters, config)
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    prompts = [tokenizer.encode(p) for _, p in pairs]
    requests = engine.generate(prompts, params, [a for a, _ in pairs])
    for request, key in zip(requests, pairs, strict=True):
        assert request.output == expected[key], key
    engine.blocks.check()
    assert engine.blocks.in_use == engine.memory.adapter_blocks()  # all KV blocks released
    return engine, requests


def test_each_adapter_alone_matches_peft(served):
    for name in [None, *served[1]]:
        for prompt in PROMPTS:
            _run(served, EngineConfig(block_size=4, num_blocks=32), [(name, prompt)])


@pytest.mark.parametrize("policy", ["vllm", "slora", "elora"])
def test_mixed_batches_swaps_and_preemption_match_peft(served, policy):
    """Every (adapter, prompt) pair in one stream: with room for all, they share batches
    (the first steps run while adapters are copied in); with a pool so small that adapters
    (7 blocks each) and KV compete, adapters are evicted and copied back, prompts are
    chunked and requests preempted — and every token still equals PEFT's."""
    pairs = [(a, p) for p in PROMPTS for a in [None, *served[1]]]
    roomy = EngineConfig(block_size=4, num_blocks=256, policy=policy, max_loras=3)
    engine, _ = _run(served, roomy, pairs)
    assert engine.peak_batch >= 8  # requests of different adapters shared a step
    tight = EngineConfig(block_size=4, num_blocks=24, max_num_batched_tokens=7, policy=policy,
                         max_loras=1, link_gbps=100.0)  # fmt: skip
    engine, requests = _run(served, tight, pairs)
    assert sum(r.preemptions for r in requests) > 0
    assert engine.memory.swapped_in_bytes >= 3 * engine.memory.adapters["lora-0"].host.nbytes


def test_adapters_change_the_answers(served):
    expected = served[3]
    assert any(expected[(None, p)] != expected[("lora-0", p)] for p in PROMPTS)


@pytest.mark.parametrize("policy", ["vllm", "slora", "elora"])
def test_prefixes_swapped_to_host_come_back_and_match_peft(served, policy):
    """With host swap space, cached prefix blocks the tight pool evicts go to the host; the
    same stream again finds them there and copies them back instead of recomputing — and
    every token still equals PEFT's."""
    model, adapters, tokenizer, expected = served
    pairs = [(a, p) for p in PROMPTS for a in [None, *adapters]]
    config = EngineConfig(block_size=4, num_blocks=24, max_num_batched_tokens=7, policy=policy,
                          max_loras=1, link_gbps=100.0, swap_space=2**20)  # fmt: skip
    engine = Engine(model, tokenizer, adapters, config)
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    for _ in range(2):
        requests = engine.generate([tokenizer.encode(p) for _, p in pairs], params,
                                   [a for a, _ in pairs])  # fmt: skip
        for request, key in zip(requests, pairs, strict=True):
            assert request.output == expected[key], key
    host = engine.memory.host_kv
    assert host.stored_bytes > 0 and host.hits > 0
    engine.blocks.check()
    assert engine.blocks.in_use == engine.memory.adapter_blocks()
