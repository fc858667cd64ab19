"""The OpenAI-compatible HTTP server: FastAPI routes over one engine's ``Frontend``.

The routes parse and check the OpenAI bodies (``protocol.py``) and hand them to the
frontend (``frontend.py``: the engine thread, streaming, stop strings, aborts); a client
that disconnects while waiting for a whole answer is noticed within half a second and its
request aborted. Errors are OpenAI's error object: unknown model 404, bad field 400, full
queue 429.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from legato.errors import CheckpointError, ConfigError
from legato.lora.peft_io import load_adapter
from legato.serve.engine import Engine
from legato.serve.frontend import Frontend
from legato.serve.protocol import (
    ChatRequest,
    CompletionRequest,
    LoadLora,
    UnloadLora,
    error_body,
    model_list,
)
from legato.serve.sampling import RequestError


def create_app(engine: Engine, adapter_paths: dict[str, str] | None = None) -> FastAPI:
    """The app serving ``engine`` (its base model under ``engine.model_name``, each adapter
    under its own name); ``app.state.frontend`` is closed on shutdown."""
    frontend = Frontend(engine)
    metrics = frontend.metrics
    paths = dict(adapter_paths or {})

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        frontend.close()

    app = FastAPI(title="legato", lifespan=lifespan)
    app.state.frontend = frontend
    add_error_handlers(app)

    async def answer(body, chat: bool, raw: Request):
        pending = frontend.submit(body, chat)
        if body.stream:
            return StreamingResponse(pending.events(), media_type="text/event-stream")
        result = await pending.result(raw.is_disconnected)
        return Response(status_code=499) if result is None else result

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, raw: Request):
        return await answer(body, False, raw)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatRequest, raw: Request):
        return await answer(body, True, raw)

    @app.get("/v1/models")
    async def models():
        return model_list(engine.model_name, {n: paths.get(n, n) for n in engine.adapters})

    @app.post("/v1/load_lora_adapter")
    async def load_lora(body: LoadLora):
        if body.lora_name == engine.model_name:
            raise RequestError("lora_name: that is the base model's name", 400, "lora_name")
        try:
            adapter = await asyncio.to_thread(load_adapter, body.lora_path, engine.model)
        except (CheckpointError, ConfigError) as exc:
            raise RequestError(f"lora_path: {exc}", 400, "lora_path") from None
        engine.load_adapter(body.lora_name, adapter.eval(), Path(body.lora_path))
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


def add_error_handlers(app: FastAPI) -> None:
    """OpenAI's error object for a refused request and for a body that fails validation
    (a 400 naming the field, never FastAPI's 422)."""

    @app.exception_handler(RequestError)
    async def _refused(_: Request, exc: RequestError) -> JSONResponse:
        return JSONResponse(error_body(str(exc), exc.status, exc.param), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"][1:]) or "body"
        return JSONResponse(error_body(f"{field}: {first['msg']}", 400, field), status_code=400)
