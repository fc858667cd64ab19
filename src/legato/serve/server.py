"""The OpenAI-compatible HTTP server: FastAPI routes over one engine stepping in a thread.

The engine runs in its own thread (``EngineThread``) so a step's tensor work never blocks
the event loop; each request gets an asyncio queue that the engine thread feeds through the
request's ``on_update`` (``call_soon_threadsafe``). Streaming answers are server-sent
events ending in ``data: [DONE]``, with a usage chunk first when ``stream_options.
include_usage`` asks; text is held back while it could still turn into a stop string or
ends in half a UTF-8 character. A client that goes away aborts its request, which frees its
blocks. Errors are OpenAI's error object: unknown model 404, bad field 400, full queue 429.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from legato.errors import CheckpointError, ConfigError
from legato.lora.peft_io import load_adapter
from legato.serve.engine import FINISHED, Engine
from legato.serve.metrics import ServerMetrics
from legato.serve.protocol import (
    ChatRequest,
    CompletionRequest,
    LoadLora,
    UnloadLora,
    completion_body,
    error_body,
    usage,
)
from legato.serve.sampling import RequestError

_DISCONNECT_POLL_S = 0.5


class EngineThread:
    """Steps the engine whenever it has work; ``submit`` wakes it."""

    def __init__(self, engine: Engine, metrics: ServerMetrics) -> None:
        self.engine, self.metrics = engine, metrics
        self._wake = threading.Event()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="legato-engine", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop:
            if self.engine.has_work:
                try:
                    self.engine.step()
                except Exception as exc:  # a bug must not leave every client waiting forever
                    self.engine.fail_all(f"{type(exc).__name__}: {exc}")
            else:
                self._wake.wait(0.05)
                self._wake.clear()

    def submit(self, prompt, params, adapter, on_update):
        counted = []

        def update(request) -> None:
            if request.state == FINISHED and not counted:  # abort and step may both report it
                counted.append(True)
                self.metrics.observe_finished(request, time.monotonic())
            on_update(request)

        request = self.engine.add(prompt, params, adapter, update)
        self._wake.set()
        return request

    def close(self) -> None:
        self._stop = True
        self._wake.set()
        self._thread.join(timeout=10)


def _held_back(text: str, stops: tuple[str, ...]) -> int:
    """How many trailing characters may not be sent yet: half a UTF-8 character, or the
    start of a stop string."""
    whole = text.rstrip("\ufffd")
    partial = len(text) - len(whole)
    keep = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(whole)), 0, -1):
            if whole.endswith(stop[:n]):
                keep = max(keep, n)
                break
    return partial + keep


def create_app(engine: Engine, adapter_paths: dict[str, str] | None = None) -> FastAPI:
    """The app serving ``engine`` (its base model under ``engine.model_name``, each adapter
    under its own name); ``app.state.engine_thread`` is closed on shutdown."""
    metrics = ServerMetrics(engine.model_name)
    worker = EngineThread(engine, metrics)
    paths = dict(adapter_paths or {})

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        worker.close()

    app = FastAPI(title="legato", lifespan=lifespan)
    app.state.engine_thread = worker

    @app.exception_handler(RequestError)
    async def _refused(_: Request, exc: RequestError) -> JSONResponse:
        return JSONResponse(error_body(str(exc), exc.status, exc.param), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"][1:]) or "body"
        return JSONResponse(error_body(f"{field}: {first['msg']}", 400, field), status_code=400)

    def adapter_of(model: str) -> str | None:
        if model == engine.model_name:
            return None
        if model in engine.adapters:
            return model
        raise RequestError(f"model: the model {model!r} does not exist", 404, "model")

    async def answer(body, prompt: list[int], chat: bool, raw: Request) -> Any:
        adapter = adapter_of(body.model)
        default = engine.max_model_len - len(prompt)
        if chat and body.max_completion_tokens is not None:
            body.max_tokens = body.max_completion_tokens
        params = body.sampling(max(default, 1))
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()

        def on_update(request) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, request.state == FINISHED)

        request = worker.submit(prompt, params, adapter, on_update)
        if body.stream:
            return StreamingResponse(
                _events(request, queue, body, params.stop, chat), media_type="text/event-stream"
            )
        try:
            while True:
                try:
                    if await asyncio.wait_for(queue.get(), _DISCONNECT_POLL_S):
                        break
                except asyncio.TimeoutError:
                    if await raw.is_disconnected():
                        engine.abort(request)
                        return Response(status_code=499)
        except asyncio.CancelledError:
            engine.abort(request)
            raise
        if request.error:
            raise RequestError(f"the engine failed: {request.error}", 500)
        counts = usage(len(prompt), len(request.output))
        return completion_body(request.id, body.model, request.text, request.finish_reason,
                               chat, counts)  # fmt: skip

    async def _events(request, queue, body, stops, chat: bool) -> AsyncIterator[str]:
        sent = 0
        try:
            if chat:
                first = completion_body(request.id, body.model, "", None, True, None)
                first["choices"][0]["delta"] = {"role": "assistant", "content": ""}
                yield f"data: {json.dumps(first)}\n\n"
            done = False
            while not done:
                done = await queue.get()
                text = request.text
                upto = len(text) if done else len(text) - _held_back(text, stops)
                if upto > sent or done:
                    finish = request.finish_reason if done else None
                    chunk = completion_body(request.id, body.model, text[sent:upto], finish,
                                            chat, None)  # fmt: skip
                    if chat:
                        chunk["choices"][0]["delta"] = {"content": text[sent:upto]}
                    sent = max(sent, upto)
                    yield f"data: {json.dumps(chunk)}\n\n"
            if request.error:
                yield f"data: {json.dumps(error_body(request.error, 500))}\n\n"
            if body.include_usage:
                last = completion_body(request.id, body.model, "", None, chat, None)
                last["choices"] = []
                last["usage"] = usage(len(request.prompt), len(request.output))
                yield f"data: {json.dumps(last)}\n\n"
            yield "data: [DONE]\n\n"
        finally:
            if request.state != FINISHED:  # the client went away mid-stream
                engine.abort(request)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, raw: Request):
        return await answer(body, body.prompt_ids(engine.tokenizer.encode), False, raw)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatRequest, raw: Request):
        return await answer(body, engine.tokenizer.encode(body.prompt_text()), True, raw)

    @app.get("/v1/models")
    async def models():
        created = int(time.time())
        base = engine.model_name
        rows = [{"id": base, "object": "model", "created": created, "owned_by": "legato",
                 "root": base, "parent": None}]  # fmt: skip
        for name in engine.adapters:
            rows.append({"id": name, "object": "model", "created": created, "owned_by": "legato",
                         "root": paths.get(name, name), "parent": base})  # fmt: skip
        return {"object": "list", "data": rows}

    @app.post("/v1/load_lora_adapter")
    async def load_lora(body: LoadLora):
        if body.lora_name == engine.model_name:
            raise RequestError("lora_name: that is the base model's name", 400, "lora_name")
        try:
            adapter = await asyncio.to_thread(load_adapter, body.lora_path, engine.model)
        except (CheckpointError, ConfigError) as exc:
            raise RequestError(f"lora_path: {exc}", 400, "lora_path") from None
        engine.load_adapter(body.lora_name, adapter.eval())
        paths[body.lora_name] = body.lora_path
        return Response(f"Success: LoRA adapter '{body.lora_name}' added successfully.")

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora(body: UnloadLora):
        engine.unload_adapter(body.lora_name)
        paths.pop(body.lora_name, None)
        return Response(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")

    @app.get("/health")
    async def health():
        return Response(status_code=200)

    @app.get("/metrics")
    async def prometheus():
        with engine.lock:
            metrics.observe_engine(engine)
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app
