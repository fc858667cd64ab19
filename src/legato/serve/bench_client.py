"""The load generator of ``legato bench serve``: replays a request stream against an
OpenAI-compatible ``/v1/completions`` endpoint and times every streamed chunk.

Each request is sent at its ``arrival_s`` whether or not earlier ones have finished (an
open loop, as in vLLM's ``benchmark_serving``), at most ``max_concurrency`` at a time when
given; a request waiting for a slot starts its clock when it is sent, as in vLLM. The body
is vLLM's: ``stream`` with ``include_usage``, ``max_tokens`` = the request's output length,
``ignore_eos`` (so every request generates exactly that many tokens) and greedy sampling.
The model is the adapter's name, or the base model's for a base-model request.

A chunk that carries text is a token time; the final usage chunk gives the exact token
counts (without one, each text chunk counts as one token). A request fails (and the run goes
on) on an HTTP error status, an ``error`` event, a broken stream or no text at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Sequence

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
) -> tuple[list[RequestTiming], float]:
    """Every request's timing, in request order, and the wall time from the first send to
    the last answer. ``timeout_s`` bounds each wait (connect, first byte, next chunk)."""
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
    client = httpx.AsyncClient(timeout=httpx.Timeout(timeout_s), limits=limits, trust_env=False)
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
    usage = None
    try:
        async with client.stream("POST", url, json=body) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode("utf-8", errors="replace")
                timing.error = f"HTTP {response.status_code}: {text.strip()[:500]}"
            else:
                usage = await _read_events(response, timing, t0)
    except Exception as exc:  # one broken request must not end the benchmark
        timing.error = f"{type(exc).__name__}: {exc}"
    timing.end_s = timing.token_times[-1] if timing.token_times else time.perf_counter() - t0
    if timing.token_times and timing.error is None:
        timing.ok = True
        timing.first_token_s = timing.token_times[0]
        timing.output_tokens = len(timing.token_times)
        if usage:
            timing.output_tokens = usage.get("completion_tokens") or timing.output_tokens
            timing.prompt_tokens = usage.get("prompt_tokens") or timing.prompt_tokens
    elif timing.error is None:
        timing.error = "the stream ended without any text"
    return timing


async def _read_events(response: httpx.Response, timing: RequestTiming, t0: float) -> dict | None:
    """Read server-sent events to ``data: [DONE]``: text chunk times into ``timing``, an
    error event into ``timing.error``; returns the last usage seen."""
    usage = None
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            continue  # blank separators, comments, other fields
        data = line[len("data:") :].strip()
        if data == "[DONE]":
            break
        event = json.loads(data)
        if "error" in event:
            timing.error = f"server error: {event['error']}"
            break
        choices = event.get("choices") or []
        if choices and choices[0].get("text"):
            timing.token_times.append(time.perf_counter() - t0)
        usage = event.get("usage") or usage
    return usage
