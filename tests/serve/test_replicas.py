"""Two engines behind Ray Serve on loopback: every adapter answers as one engine alone would,
repeated requests for an adapter stay on the replica that holds it, and the router refuses
what the single server refuses, with the same OpenAI errors, behind the same guard (API key,
body bound, adapter loads only under the lora root)."""

from __future__ import annotations

import json
import socket
import time

import pytest

pytest.importorskip("ray.serve")
import httpx
import torch

from legato.lora.peft_io import save_adapter
from legato.serve.access import Access
from legato.serve.engine import Engine, EngineConfig
from legato.serve.loading import generated_adapters, load_adapters, load_served_model
from legato.serve.replicas import ReplicaSpec, build_app, ray_serve
from legato.serve.sampling import SamplingParams

pytestmark = pytest.mark.distributed

CONFIG = EngineConfig(block_size=8, num_blocks=96, max_num_seqs=4, link_gbps=50.0)
PROMPTS = {"lora-0": "the cat", "lora-1": "a dog ran", "lora-2": "hello", "tiny": "base"}
KEY = {"Authorization": "Bearer sk-replicas"}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("adapters")
    model, _, base = load_served_model("tiny")
    for name, adapter in generated_adapters(model, count=4, rank=4, seed=3).items():
        save_adapter(adapter, root / name, base)
    return root


@pytest.fixture(scope="module")
def url(folders):
    extra = folders.parent / "later"  # lora-3, loaded through the API
    extra.mkdir()
    (folders / "lora-3").rename(extra / "lora-3")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    access = Access(api_key="sk-replicas", max_request_bytes=2**16, lora_updating=True,
                    lora_roots=(extra,))  # fmt: skip
    app = build_app(ReplicaSpec(config=CONFIG), [str(folders)], replicas=2, adapters_per_replica=1,
                    access=access)  # fmt: skip
    with ray_serve(app, "127.0.0.1", port, cpus=2) as base_url:
        yield base_url, extra


def _alone(folders, extra, name: str, prompt: str) -> str:
    """The answer of one engine in this process holding every adapter."""
    model, tokenizer, _ = load_served_model("tiny")
    adapters = load_adapters([str(folders), str(extra)], model)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as on a one-CPU replica
    try:
        engine = Engine(model, tokenizer, adapters, CONFIG)
        params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
        adapter = None if name == "tiny" else name
        (request,) = engine.generate([tokenizer.encode(prompt)], params, [adapter])
    finally:
        torch.set_num_threads(threads)
    return request.text


def _complete(client, model: str, prompt: str, **extra) -> httpx.Response:
    body = {"model": model, "prompt": prompt, "max_tokens": 6, "temperature": 0,
            "ignore_eos": True, **extra}  # fmt: skip
    return client.post("/v1/completions", json=body)


def test_each_adapter_answers_as_one_engine_and_stays_on_its_replica(url, folders):
    base_url, extra = url
    with httpx.Client(base_url=base_url, timeout=60, headers=KEY) as client:
        listed = {row["id"]: row["parent"] for row in client.get("/v1/models").json()["data"]}
        assert listed == {"tiny": None, "lora-0": "tiny", "lora-1": "tiny", "lora-2": "tiny"}
        for name, prompt in PROMPTS.items():
            assert _complete(client, name, prompt).status_code == 200  # loads it somewhere
            time.sleep(1.0)  # the replica reports what it holds every 0.1 s; routers hear it
            replies = [_complete(client, name, prompt) for _ in range(3)]
            assert all(r.status_code == 200 for r in replies), replies[0].text
            texts = {r.json()["choices"][0]["text"] for r in replies}
            assert texts == {_alone(folders, extra, name, prompt)}, name
            if name != "tiny":  # multiplexing: the replica holding it answers again
                assert len({r.json()["system_fingerprint"] for r in replies}) == 1, name
        with client.stream("POST", "/v1/completions", json={
            "model": "lora-1", "prompt": PROMPTS["lora-1"], "max_tokens": 6, "temperature": 0,
            "ignore_eos": True, "stream": True}) as streamed:  # fmt: skip
            lines = [line for line in streamed.iter_lines() if line]
        assert lines[-1] == "data: [DONE]"
        text = "".join(json.loads(line[6:])["choices"][0]["text"] for line in lines[:-1])
        assert text == _alone(folders, extra, "lora-1", PROMPTS["lora-1"])


def test_router_refuses_and_loads_like_the_single_server(url, folders):
    base_url, extra = url
    with httpx.Client(base_url=base_url, timeout=60) as anyone:
        refused = _complete(anyone, "tiny", "x")
        assert refused.status_code == 401 and refused.json()["error"]["code"] == 401
        assert anyone.get("/health").status_code == 200
    with httpx.Client(base_url=base_url, timeout=60, headers=KEY) as client:
        large = _complete(client, "tiny", "x" * 2**16)
        assert large.status_code == 413 and "--max-request-bytes" in large.text
        long = _complete(client, "tiny", "x" * 300)  # the replica's engine: 256 tokens of context
        assert long.status_code == 400 and long.json()["error"]["param"] == "prompt"
        outside = client.post("/v1/load_lora_adapter",
                              json={"lora_name": "new", "lora_path": str(folders / "lora-0")})  # fmt: skip
        assert outside.status_code == 400 and "--lora-root" in outside.json()["error"]["message"]
        missing = _complete(client, "lora-9", "x")
        assert missing.status_code == 404 and missing.json()["error"]["param"] == "model"
        zero = _complete(client, "lora-0", "x", max_tokens=0)
        assert zero.status_code == 400 and zero.json()["error"]["param"] == "max_tokens"
        stream_zero = _complete(client, "lora-0", "x", max_tokens=0, stream=True)
        assert stream_zero.status_code == 400  # refused before the event stream starts
        bad = client.post("/v1/load_lora_adapter",
                          json={"lora_name": "new", "lora_path": str(extra / "none")})  # fmt: skip
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "lora_path"
        loaded = client.post("/v1/load_lora_adapter",
                             json={"lora_name": "lora-3", "lora_path": str(extra / "lora-3")})  # fmt: skip
        assert loaded.status_code == 200
        again = client.post("/v1/load_lora_adapter",
                            json={"lora_name": "lora-3", "lora_path": str(extra / "lora-3")})  # fmt: skip
        assert again.status_code == 400
        reply = _complete(client, "lora-3", "new one")
        assert reply.json()["choices"][0]["text"] == _alone(folders, extra, "lora-3", "new one")
        assert (
            client.post("/v1/unload_lora_adapter", json={"lora_name": "lora-3"}).status_code == 200
        )
        assert _complete(client, "lora-3", "new one").status_code == 404
