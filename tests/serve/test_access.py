"""The guard (``serve/access.py``) of both servers, in process: the single server's app and
the Ray Serve router's app answer the same refusals, each an OpenAI error object — a missing
or wrong API key 401 on every /v1 route (health and metrics open), runtime adapter loading
off unless enabled and then only under the lora roots (no ``..`` or symlink escape), bodies
bounded in bytes and prompts in tokens, bad JSON and bad UTF-8 a 400 that says so."""

from __future__ import annotations

import hmac

import pytest
from fastapi.testclient import TestClient

from legato.errors import ConfigError
from legato.lora.peft_io import CONFIG_FILE, WEIGHTS_FILE, save_adapter
from legato.serve.access import Access
from legato.serve.engine import Engine, EngineConfig
from legato.serve.loading import generated_adapters, load_served_model
from legato.serve.server import create_app

KEY = "sk-legato-test"
V1_ROUTES = [("GET", "/v1/models"), ("POST", "/v1/completions"),
             ("POST", "/v1/chat/completions"), ("POST", "/v1/load_lora_adapter"),
             ("POST", "/v1/unload_lora_adapter")]  # fmt: skip


@pytest.fixture(scope="module")
def served():
    """(model, tokenizer, name) of the tiny preset, loaded once."""
    return load_served_model("tiny")


def _router_app(access: Access):
    """The Ray Serve router's FastAPI app, built without Ray: only the routes that never
    reach a replica are called here (``test_replicas.py`` runs it under Ray Serve)."""
    pytest.importorskip("ray.serve")
    from legato.serve.replicas import Router

    plain = Router.func_or_class.__mro__[1]  # the class under Ray Serve's ingress wrapper
    router = plain.__new__(plain)
    plain.__init__(router, None, "tiny", {}, access)
    return router.__serve_build_asgi_app__()


@pytest.fixture(params=["server", "router"])
def client_for(request, served):
    """``client_for(access)``: a TestClient of that app (lifespan run, closed after)."""
    clients = []

    def make(access: Access) -> TestClient:
        if request.param == "server":
            model, tokenizer, name = served
            config = EngineConfig(block_size=8, num_blocks=64)
            app = create_app(Engine(model, tokenizer, {}, config, model_name=name), access=access)
        else:
            app = _router_app(access)
        clients.append(TestClient(app).__enter__())
        return clients[-1]

    yield make
    for client in clients:
        client.__exit__(None, None, None)


def _refused(reply, status: int, kind: str, says: str, param=None) -> None:
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert error["type"] == kind and error["code"] == status and error["param"] == param, error
    assert says in error["message"], error


def test_the_api_key_guards_every_v1_route_in_constant_time(client_for, monkeypatch):
    compared = []
    real = hmac.compare_digest
    monkeypatch.setattr(hmac, "compare_digest", lambda a, b: compared.append(1) or real(a, b))
    client = client_for(Access(api_key=KEY))
    for method, path in V1_ROUTES:
        for header in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY},
                       {"Authorization": f"Bearer {KEY}x"}, {"Authorization": f"bearer {KEY}"}):  # fmt: skip
            reply = client.request(method, path, headers=header, json={})
            _refused(reply, 401, "AuthenticationError", "API key")
            assert reply.headers["www-authenticate"] == "Bearer"
    assert len(compared) == 5 * len(V1_ROUTES)  # each one compared by hmac, none by ==
    with_key = {"Authorization": f"Bearer {KEY}"}
    assert client.get("/v1/models", headers=with_key).json()["data"][0]["id"] == "tiny"
    bad = client.post("/v1/completions", headers=with_key, json={"model": "tiny"})
    assert bad.status_code == 400  # past the guard: the body is checked
    assert client.get("/health").status_code == 200  # probes need no key, as in vLLM


def test_metrics_stay_open_under_a_key(served):
    model, tokenizer, name = served
    engine = Engine(
        model, tokenizer, {}, EngineConfig(block_size=8, num_blocks=64), model_name=name
    )
    with TestClient(create_app(engine, access=Access(api_key=KEY))) as client:
        assert "vllm:num_requests_running" in client.get("/metrics").text


def test_runtime_lora_updating_is_off_unless_enabled(client_for, served, tmp_path):
    save_adapter(generated_adapters(served[0], count=1, rank=2)["lora-0"], tmp_path / "a", "tiny")
    client = client_for(Access())
    load = client.post(
        "/v1/load_lora_adapter", json={"lora_name": "a", "lora_path": str(tmp_path / "a")}
    )
    _refused(load, 404, "NotFoundError", "--enable-lora-updating")
    unload = client.post("/v1/unload_lora_adapter", json={"lora_name": "a"})
    _refused(unload, 404, "NotFoundError", "--enable-lora-updating")
    assert [m["id"] for m in client.get("/v1/models").json()["data"]] == ["tiny"]


def test_runtime_loads_stay_under_the_lora_roots(client_for, served, tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    adapter = generated_adapters(served[0], count=1, rank=2)["lora-0"]
    save_adapter(adapter, root / "good", "tiny")
    save_adapter(adapter, outside / "evil", "tiny")
    (root / "link").symlink_to(outside / "evil")  # a folder that leads out
    (root / "half").mkdir()  # a folder whose weights lead out
    (root / "half" / CONFIG_FILE).write_bytes((root / "good" / CONFIG_FILE).read_bytes())
    (root / "half" / WEIGHTS_FILE).symlink_to(outside / "evil" / WEIGHTS_FILE)
    client = client_for(Access(lora_updating=True, lora_roots=(root,)))
    escapes = [outside / "evil", f"{root}/../outside/evil", root / "link", root / "half", "/etc"]
    for path in escapes:
        reply = client.post(
            "/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": str(path)}
        )
        _refused(
            reply, 400, "invalid_request_error", "not inside the server's --lora-root", "lora_path"
        )
    good = client.post("/v1/load_lora_adapter",
                       json={"lora_name": "good", "lora_path": f"{root}/sub/../good"})  # fmt: skip
    assert good.status_code == 200, good.text
    listed = {m["id"]: m["root"] for m in client.get("/v1/models").json()["data"]}
    assert listed == {"tiny": "tiny", "good": str((root / "good").resolve())}
    assert client.post("/v1/unload_lora_adapter", json={"lora_name": "good"}).status_code == 200


def test_updating_needs_a_root_and_a_root_needs_updating(tmp_path):
    with pytest.raises(ConfigError, match="--lora-root: --enable-lora-updating needs"):
        Access(lora_updating=True)
    with pytest.raises(ConfigError, match="--lora-root: only used with --enable-lora-updating"):
        Access(lora_roots=(tmp_path,))
    with pytest.raises(ConfigError, match=r"--lora-root: .* is not a directory"):
        Access(lora_updating=True, lora_roots=(tmp_path / "none",))
    with pytest.raises(ConfigError, match="--api-key: must not be empty"):
        Access(api_key="")


def test_request_bodies_are_bounded(client_for):
    client = client_for(Access(max_request_bytes=1000))
    big = {"model": "tiny", "prompt": "x" * 2000}
    _refused(client.post("/v1/completions", json=big), 413, "invalid_request_error",
             "larger than the server's limit of 1000 bytes")  # fmt: skip
    chunked = iter([b'{"model": "tiny", "prompt": "', b"x" * 990, b'"}'])  # no Content-Length
    _refused(client.post("/v1/completions", content=chunked,
                         headers={"Content-Type": "application/json"}), 413,
             "invalid_request_error", "--max-request-bytes")  # fmt: skip
    small = client.post("/v1/completions", json={"model": "tiny"})
    assert small.status_code == 400 and small.json()["error"]["param"] == "prompt"


def test_bad_json_bad_utf8_and_unknown_routes_are_openai_errors(client_for):
    client = client_for(Access())
    json_type = {"Content-Type": "application/json"}
    cut = client.post("/v1/completions", content=b'{"model": "tiny", "prompt": ', headers=json_type)
    _refused(cut, 400, "invalid_request_error", "request body is not valid JSON: Expecting value")
    latin = client.post("/v1/completions", content='{"model": "tiny", "prompt": "é"}'.encode("latin-1"),
                        headers=json_type)  # fmt: skip
    _refused(latin, 400, "invalid_request_error", "request body is not valid UTF-8")
    _refused(client.get("/v1/nothing"), 404, "NotFoundError", "Not Found")
    _refused(client.get("/v1/completions"), 405, "invalid_request_error", "Method Not Allowed")


def test_prompts_are_bounded_by_the_context(served):
    model, tokenizer, name = served
    engine = Engine(
        model, tokenizer, {}, EngineConfig(block_size=8, num_blocks=96), model_name=name
    )
    context = engine.max_model_len
    with TestClient(create_app(engine)) as client:
        for prompt in ("x" * (context + 40), [5] * context):
            reply = client.post("/v1/completions", json={"model": "tiny", "prompt": prompt})
            _refused(reply, 400, "invalid_request_error", f"maximum context length is {context}",
                     "prompt")  # fmt: skip
        chat = client.post("/v1/chat/completions", json={
            "model": "tiny", "messages": [{"role": "user", "content": "x" * context}]})  # fmt: skip
        _refused(chat, 400, "invalid_request_error", "maximum context length", "prompt")
        long = client.post("/v1/completions",
                           json={"model": "tiny", "prompt": "x" * (context - 10), "max_tokens": 20})  # fmt: skip
        _refused(long, 400, "invalid_request_error", "20 in the completion", "max_tokens")
