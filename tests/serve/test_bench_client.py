"""The load generator against a real HTTP server on 127.0.0.1 that streams server-sent events
with known pauses: what it sends, what it times, what it reads from the usage chunk, what
counts as a failure (and ``legato bench serve`` says why), and that an empty completion does
not."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from itertools import pairwise

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from http_harness import served

from legato.cli.main import main
from legato.serve.bench_client import run_benchmark
from legato.serve.bench_metrics import summarize
from legato.serve.workload import BenchRequest

FIRST_S = 0.05  # the server's pause before the first chunk
GAP_S = 0.05  # and between chunks
CHUNKS = 4
TOKENS_PER_CHUNK = 2  # so the usage count differs from the chunk count

app = FastAPI()
seen: list[dict] = []


MODELS = ("base", "a0", "silent", "broken", "empty", "cut")


@app.get("/v1/models")
async def models():  # every model it answers for; "a0" an adapter of "base"
    return {"data": [{"id": m, "parent": "base" if m == "a0" else None} for m in MODELS]}


@app.post("/v1/completions")
async def completions(request: Request):
    body = await request.json()
    seen.append(body)
    if body["model"] not in MODELS:
        return JSONResponse({"error": f"unknown model {body['model']}"}, status_code=404)

    async def events():
        if body["model"] == "broken":
            yield _event({"choices": [{"index": 0, "text": "ab"}]})
            yield _event({"error": {"message": "out of blocks"}})
        elif body["model"] == "cut":  # the server went away mid-answer
            yield _event({"choices": [{"index": 0, "text": "ab"}]})
            return
        elif body["model"] == "empty":  # EOS first: an answer without text (legato's shape)
            await asyncio.sleep(FIRST_S)
            yield _event({"choices": [{"index": 0, "text": "", "finish_reason": "stop"}]})
            yield _event({"choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 0}})
        elif body["model"] != "silent":
            await asyncio.sleep(FIRST_S)
            for i in range(CHUNKS):
                if i:
                    await asyncio.sleep(GAP_S)
                yield _event({"choices": [{"index": 0, "text": "ab", "finish_reason": None}]})
            usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": 2 * CHUNKS}
            yield _event({"choices": [], "usage": usage})
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


def _event(payload: dict) -> str:
    return f"data: {json.dumps(payload)}\n\n"


@pytest.fixture(scope="module")
def server_url() -> Iterator[str]:
    with served(app) as url:
        yield url + "/"


def _request(index: int, arrival_s: float, adapter: str | None) -> BenchRequest:
    return BenchRequest(index, arrival_s, adapter, prompt_tokens=12, output_tokens=8)


def test_streamed_requests_are_timed_and_counted(server_url: str) -> None:
    seen.clear()
    requests = [
        _request(0, 0.0, None),
        _request(1, 0.05, "a0"),
        _request(2, 0.1, "missing"),
        _request(3, 0.1, "silent"),
        _request(4, 0.1, "broken"),
    ]
    timings, duration = asyncio.run(run_benchmark(server_url, "base", requests, progress=False))

    bodies = sorted(seen, key=lambda b: b["model"])
    assert [b["model"] for b in bodies] == ["a0", "base", "broken", "missing", "silent"]
    for body in bodies:
        assert body["max_tokens"] == 8 and body["ignore_eos"] is True
        assert body["temperature"] == 0 and len(body["prompt"]) == 12
        assert body["stream"] is True and body["stream_options"] == {"include_usage": True}

    assert [t.index for t in timings] == [0, 1, 2, 3, 4]
    for t, r in zip(timings[:2], requests[:2], strict=True):
        assert t.ok and t.error is None and t.adapter == r.adapter
        assert t.start_s >= r.arrival_s
        assert t.output_tokens == CHUNKS * TOKENS_PER_CHUNK  # from the usage chunk
        assert t.prompt_tokens == 12
        assert len(t.token_times) == CHUNKS and t.token_times == sorted(t.token_times)
        assert FIRST_S <= t.first_token_s - t.start_s < 5.0
        assert t.end_s == t.token_times[-1]
        assert t.end_s - t.start_s >= FIRST_S + (CHUNKS - 1) * GAP_S
        assert GAP_S <= t.token_times[-1] - t.token_times[0] < 5.0  # three gaps were paused
    missing, silent, broken = timings[2:]
    assert not missing.ok and missing.error.startswith("HTTP 404")
    assert not silent.ok and "without a choice" in silent.error
    assert not broken.ok and "out of blocks" in broken.error
    assert duration >= max(t.end_s for t in timings)

    result = summarize(timings, duration)
    assert result["completed"] == 2 and result["failed"] == 3
    assert result["mean_ttft_ms"] >= FIRST_S * 1000
    assert result["total_output_tokens"] == 2 * CHUNKS * TOKENS_PER_CHUNK


def test_max_concurrency_serialises_requests(server_url: str) -> None:
    requests = [_request(i, 0.0, None) for i in range(3)]
    timings, _ = asyncio.run(run_benchmark(server_url, "base", requests, max_concurrency=1))
    assert all(t.ok for t in timings)
    spans = sorted((t.start_s, t.end_s) for t in timings)
    assert all(later[0] >= earlier[1] for earlier, later in pairwise(spans))


def test_an_empty_completion_is_an_answer_and_a_broken_stream_a_failure(server_url: str) -> None:
    requests = [_request(0, 0.0, "empty"), _request(1, 0.0, "cut")]
    (empty, cut), _ = asyncio.run(run_benchmark(server_url, "base", requests, progress=False))
    assert empty.ok and empty.error is None and empty.output_tokens == 0
    assert empty.token_times == [] and empty.first_token_s == empty.end_s
    assert FIRST_S <= empty.first_token_s - empty.start_s < 5.0  # timed by its choice
    assert not cut.ok and "before data: [DONE]" in cut.error
    result = summarize([empty], 1.0)
    assert result["completed"] == 1 and result["failed"] == 0


@pytest.mark.parametrize(("model", "code", "says"), [
    ("empty", 0, None),
    ("broken", 1, "failed: 2 request(s): server error: {'message': 'out of blocks'}"),
    ("nope", 2, "--model: the server at"),  # not listed: refused before any request
])  # fmt: skip
def test_bench_serve_exits_by_failures_and_says_why(server_url, model, code, says, capsys):
    argv = ["bench", "serve", "--base-url", server_url, "--model", model, "--num-adapters", "0",
            "--num-prompts", "2", "--input-len", "4,5", "--output-len", "2,3"]  # fmt: skip
    assert main(argv) == code
    err = capsys.readouterr().err
    if says is None:
        assert "failed:" not in err
    else:
        assert says in err, err


def test_bench_serve_against_legato_behind_an_api_key(capsys, monkeypatch):
    from legato.cli.serve import API_KEY_ENV
    from legato.serve.access import Access
    from legato.serve.engine import Engine, EngineConfig
    from legato.serve.loading import generated_adapters, load_served_model
    from legato.serve.server import create_app

    monkeypatch.delenv(API_KEY_ENV, raising=False)
    model, tokenizer, name = load_served_model("tiny")
    adapters = generated_adapters(model, count=2, rank=2)
    engine = Engine(model, tokenizer, adapters, EngineConfig(block_size=8, num_blocks=64),
                    model_name=name)  # fmt: skip
    argv = ["bench", "serve", "--num-prompts", "6", "--input-len", "4,9", "--output-len", "1,4"]
    with served(create_app(engine, access=Access(api_key="sk-bench"))) as url:
        assert main([*argv, "--base-url", url]) == 2
        assert "--api-key: the server at" in capsys.readouterr().err
        monkeypatch.setenv(API_KEY_ENV, "sk-bench")
        assert main([*argv, "--base-url", url]) == 0
    out = capsys.readouterr().out
    assert "completed              6" in out and "failed                 0" in out
