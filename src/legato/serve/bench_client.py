"""The load generator of ``legato bench serve``: replays a request stream against an
OpenAI-compatible ``/v1/completions`` endpoint and times every streamed chunk.

Each request is sent at its ``arrival_s`` whether or not earlier ones have finished (an
open loop, as in vLLM's ``benchmark_serving``), at most ``max_concurrency`` at a time when
given; a request waiting for a slot starts its clock when it is sent, as in vLLM. The body
is vLLM's: ``stream`` with ``include_usage``, ``max_tokens`` = the request's output length,
``ignore_eos`` (so every request generates exactly that many tokens) and greedy sampling.
The model is the adapter's name, or the base model's for a base-model request.

A chunk that carries text is a token time; the final usage chunk gives the exact token
counts (without one, each text chunk counts as one token). A request succeeds when its
stream answers a choice and ends with ``data: [DONE]``, even with no text at all: a model
that ends at once (EOS first) has answered, in the time of that first choice (its TTFT and
end). It fails, with the reason in ``error`` (and the run goes on), on an HTTP error status,
an ``error`` event, a stream that breaks or closes before ``[DONE]``, or one with no choice.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass

import httpx
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from legato.errors import ConfigError
from legato.serve.bench_metrics import RequestTiming
from legato.serve.workload import BenchRequest, prompt_text


async def run_benchmark(
    base_url: str,
    base_model: str,
    requests: Sequence[BenchRequest],
    max_concurrency: int | None = None,
    timeout_s: float = 600.0,
    progress: bool = True,
    api_key: str | None = None,
) -> tuple[list[RequestTiming], float]:
    """Every request's timing, in request order, and the wall time from the first send to
    the last answer. ``timeout_s`` bounds each wait (connect, first byte, next chunk);
    ``api_key`` is sent as ``Authorization: Bearer`` (a server started with ``--api-key``)."""
    if max_concurrency is not None and max_concurrency < 1:
        raise ConfigError(f"--max-concurrency: must be >= 1, got {max_concurrency}")
    url = base_url.rstrip("/") + "/v1/completions"
    bodies = [_body(r, base_model) for r in requests]  # prompts built before the clock starts
    slots = asyncio.Semaphore(max_concurrency) if max_concurrency else contextlib.nullcontext()
    # httpx pools 100 connections by default: that would cap the concurrency silently.
    limits = httpx.Limits(max_connections=max_concurrency, max_keepalive_connections=None)
    columns = (TextColumn("requests"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    bar = Progress(*columns, console=Console(stderr=True), disable=not progress)
    # trust_env=False: no HTTP(S)_PROXY detour between the client and the server it measures.
    client = httpx.AsyncClient(timeout=httpx.Timeout(timeout_s), limits=limits, trust_env=False,
                               headers=bearer(api_key))  # fmt: skip
    async with client:
        with bar:
            task = bar.add_task("requests", total=len(requests))
            t0 = time.perf_counter()

            async def one(request: BenchRequest, body: dict) -> RequestTiming:
                await asyncio.sleep(max(0.0, t0 + request.arrival_s - time.perf_counter()))
                async with slots:
                    timing = await _send(client, url, request, body, t0)
                bar.advance(task)
                return timing

            timings = await asyncio.gather(
                *(one(r, b) for r, b in zip(requests, bodies, strict=True))
            )
            duration = time.perf_counter() - t0
    return list(timings), duration


def bearer(api_key: str | None) -> dict[str, str]:
    """The headers that carry ``api_key`` (none without one)."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def _body(request: BenchRequest, base_model: str) -> dict:
    return {
        "model": request.adapter or base_model,
        "prompt": prompt_text(request.prompt_tokens, seed=request.index),
        "max_tokens": request.output_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def _send(
    client: httpx.AsyncClient, url: str, request: BenchRequest, body: dict, t0: float
) -> RequestTiming:
    timing = RequestTiming(
        index=request.index,
        adapter=request.adapter,
        start_s=time.perf_counter() - t0,
        first_token_s=None,
        token_times=[],
        end_s=0.0,
        prompt_tokens=request.prompt_tokens,
        output_tokens=0,
        ok=False,
        error=None,
    )
    stream = _Stream()
    try:
        async with client.stream("POST", url, json=body) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode("utf-8", errors="replace")
                timing.error = f"HTTP {response.status_code}: {text.strip()[:500]}"
            else:
                await _read_events(response, timing, stream, t0)
    except Exception as exc:  # one broken request must not end the benchmark
        timing.error = f"{type(exc).__name__}: {exc}"
    if timing.error is None and not stream.done:
        timing.error = "the stream closed before data: [DONE]"
    elif timing.error is None and stream.answered_s is None:
        timing.error = "the stream ended without a choice (no completion in it)"
    if timing.error is not None:
        timing.end_s = time.perf_counter() - t0
        return timing
    timing.ok = True
    times = timing.token_times or [stream.answered_s]  # no text: answered by its first choice
    timing.first_token_s, timing.end_s = times[0], times[-1]
    timing.output_tokens = len(timing.token_times)
    usage = stream.usage or {}
    if isinstance(usage.get("completion_tokens"), int):
        timing.output_tokens = usage["completion_tokens"]
    timing.prompt_tokens = usage.get("prompt_tokens") or timing.prompt_tokens
    return timing


@dataclass
class _Stream:
    """What one event stream said besides its token times."""

    done: bool = False  # data: [DONE] arrived
    answered_s: float | None = None  # when the first choice arrived
    usage: dict | None = None  # the last usage seen


async def _read_events(
    response: httpx.Response, timing: RequestTiming, stream: _Stream, t0: float
) -> None:
    """Read server-sent events to ``data: [DONE]``: text chunk times into ``timing``, an
    error event into ``timing.error``, the rest into ``stream``."""
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            continue  # blank separators, comments, other fields
        data = line[len("data:") :].strip()
        if data == "[DONE]":
            stream.done = True
            break
        event = json.loads(data)
        if "error" in event:
            timing.error = f"server error: {event['error']}"
            break
        now = time.perf_counter() - t0
        choices = event.get("choices") or []
        if choices and stream.answered_s is None:
            stream.answered_s = now
        if choices and choices[0].get("text"):
            timing.token_times.append(now)
        stream.usage = event.get("usage") or stream.usage
