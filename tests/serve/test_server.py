"""The OpenAI-compatible server, driven by the official ``openai`` client over loopback: the
answers equal the engine's, streaming follows the SSE protocol, errors are OpenAI's, adapters
load and unload at run time, a client that disconnects frees its blocks, a full queue is 429,
and /metrics carries vLLM's names."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from http_harness import served

from legato.lora.peft_io import save_adapter
from legato.serve.access import Access
from legato.serve.engine import Engine, EngineConfig
from legato.serve.loading import generated_adapters, load_served_model
from legato.serve.sampling import SamplingParams
from legato.serve.server import create_app

openai = pytest.importorskip("openai")


def _adapters(engine):
    """The server's adapters again (generated from the same seed)."""
    return generated_adapters(engine.model, count=2, rank=4)


@pytest.fixture(scope="module")
def lora_root(tmp_path_factory):
    """The folder runtime adapter loads may read from (``--lora-root``)."""
    return tmp_path_factory.mktemp("lora-root")


@pytest.fixture(scope="module")
def server(lora_root):
    model, tokenizer, name = load_served_model("tiny")
    adapters = generated_adapters(model, count=2, rank=4)
    engine = Engine(model, tokenizer, adapters, EngineConfig(block_size=8, num_blocks=96,
                                                             max_queue=4), model_name=name)  # fmt: skip
    access = Access(lora_updating=True, lora_roots=(lora_root,))
    with served(create_app(engine, access=access)) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="-", timeout=60, max_retries=0)
        yield engine, url, client


def _idle(engine):
    for _ in range(200):
        if not engine.has_work:
            return
        time.sleep(0.02)


def test_completion_equals_the_engine_and_streams(server):
    engine, _, client = server
    answer = client.completions.create(model="lora-1", prompt="The sky is", max_tokens=12,
                                       temperature=0, extra_body={"ignore_eos": True})  # fmt: skip
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    local = Engine(engine.model, engine.tokenizer, _adapters(engine), EngineConfig())
    (expected,) = local.generate([engine.tokenizer.encode("The sky is")], params, ["lora-1"])
    assert answer.choices[0].text == expected.text
    assert answer.usage.completion_tokens == 12 and answer.usage.prompt_tokens == 10
    chunks = list(client.completions.create(
        model="lora-1", prompt="The sky is", max_tokens=12, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
    ))  # fmt: skip
    assert "".join(c.choices[0].text for c in chunks if c.choices) == expected.text
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_chat_and_stop_strings(server):
    _, _, client = server
    chat = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=6, temperature=0
    )
    assert chat.choices[0].message.role == "assistant"
    full = client.completions.create(model="tiny", prompt="ab", max_tokens=20, temperature=0,
                                     extra_body={"ignore_eos": True}).choices[0].text  # fmt: skip
    stop = full[3:5]
    cut = client.completions.create(model="tiny", prompt="ab", max_tokens=20, temperature=0,
                                    stop=[stop], extra_body={"ignore_eos": True})  # fmt: skip
    assert cut.choices[0].text == full[: full.find(stop)]
    assert cut.choices[0].finish_reason == "stop"


def test_errors_are_openai_shaped(server):
    _, base, client = server
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.completions.create(model="no-such-adapter", prompt="x")
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.completions.create(model="tiny", prompt="x", max_tokens=0)
    with pytest.raises(openai.BadRequestError, match="maximum context length is 256"):
        client.completions.create(model="tiny", prompt="x" * 250, max_tokens=10)
    reply = httpx.post(f"{base}/v1/completions", json={"model": "tiny"}, trust_env=False)
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "prompt"


def test_models_and_adapter_loading(server, lora_root):
    engine, base, client = server
    listed = {m.id: m for m in client.models.list().data}
    assert listed["lora-0"].parent == "tiny" and listed["tiny"].parent is None
    save_adapter(_adapters(engine)["lora-0"], lora_root / "copy", "tiny")
    loaded = httpx.post(f"{base}/v1/load_lora_adapter", trust_env=False,
                        json={"lora_name": "copy", "lora_path": str(lora_root / "copy")})  # fmt: skip
    assert loaded.status_code == 200
    a = client.completions.create(model="copy", prompt="hey", max_tokens=8, temperature=0)
    b = client.completions.create(model="lora-0", prompt="hey", max_tokens=8, temperature=0)
    assert a.choices[0].text == b.choices[0].text  # the same weights under a new name
    bad = httpx.post(f"{base}/v1/load_lora_adapter", trust_env=False,
                     json={"lora_name": "x", "lora_path": str(lora_root / "none")})  # fmt: skip
    assert bad.status_code == 400 and "lora_path" in bad.json()["error"]["message"]
    gone = httpx.post(f"{base}/v1/unload_lora_adapter", json={"lora_name": "copy"}, trust_env=False)
    assert gone.status_code == 200
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="copy", prompt="hey", max_tokens=2)


def test_disconnect_frees_blocks_and_full_queue_is_429(server):
    engine, base, _ = server
    _idle(engine)
    body = {"model": "tiny", "prompt": "a" * 40, "max_tokens": 200, "stream": True,
            "ignore_eos": True, "temperature": 0}  # fmt: skip
    with httpx.stream("POST", f"{base}/v1/completions", json=body, trust_env=False) as reply:
        for line in reply.iter_lines():
            if line.startswith("data: "):
                break  # the first token arrived; hang up
    began = time.monotonic()
    _idle(engine)
    assert time.monotonic() - began < 1.5  # aborted, not run to its 200 tokens
    assert engine.blocks.in_use == engine.memory.adapter_blocks()  # its KV blocks came back
    metrics = httpx.get(f"{base}/metrics", trust_env=False).text
    assert 'vllm:request_success_total{finished_reason="abort",model_name="tiny"} 1.0' in metrics

    statuses = []
    barrier = threading.Barrier(30)

    def flood():
        barrier.wait(timeout=60)  # all at once: 8 fit the cache, 4 may wait, the rest refused
        r = httpx.post(f"{base}/v1/completions", json={**body, "stream": False, "max_tokens": 50},
                       timeout=60, trust_env=False)  # fmt: skip
        statuses.append(r.status_code)

    threads = [threading.Thread(target=flood, daemon=True) for _ in range(30)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 120
    for t in threads:
        t.join(timeout=max(0.0, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in threads), "flood requests still waiting after 120 s"
    assert set(statuses) == {200, 429}
    _idle(engine)
    assert engine.blocks.in_use == engine.memory.adapter_blocks()
    assert httpx.get(f"{base}/health", trust_env=False).status_code == 200


def test_metrics_use_vllm_names(server):
    _, base, client = server
    client.completions.create(model="lora-0", prompt="x", max_tokens=3)
    text = httpx.get(f"{base}/metrics", trust_env=False).text
    for name in ("vllm:time_to_first_token_seconds_bucket", "vllm:time_per_output_token_seconds",
                 "vllm:e2e_request_latency_seconds_count", "vllm:num_requests_running",
                 "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc", "vllm:cpu_cache_usage_perc",
                 "vllm:lora_requests_info"):  # fmt: skip
        assert name in text, name


def test_bad_token_ids_are_refused_and_stop_text_is_held_back(server):
    from legato.serve.frontend import _held_back

    _, base, _ = server
    reply = httpx.post(f"{base}/v1/completions", json={"model": "tiny", "prompt": [5, 10**6]},
                       trust_env=False)  # fmt: skip
    assert reply.status_code == 400 and "token ids" in reply.json()["error"]["message"]
    # half a UTF-8 character after the start of a stop string: both are held back
    assert _held_back("abx\ufffd", ("xé",)) == 2
    assert _held_back("abc", ("cd",)) == 1 and _held_back("abc", ("zz",)) == 0


def test_unloading_an_adapter_forgets_its_cached_prefixes(server, lora_root):
    engine, base, client = server
    save_adapter(_adapters(engine)["lora-1"], lora_root / "temp", "tiny")
    httpx.post(f"{base}/v1/load_lora_adapter", trust_env=False,
               json={"lora_name": "temp", "lora_path": str(lora_root / "temp")})  # fmt: skip
    client.completions.create(model="temp", prompt="x" * 40, max_tokens=2)
    _idle(engine)
    assert any(engine.blocks.owner[b] == "temp" for b in engine.blocks.idle)
    httpx.post(f"{base}/v1/unload_lora_adapter", json={"lora_name": "temp"}, trust_env=False)
    assert not any(owner == "temp" for owner in engine.blocks.owner)
