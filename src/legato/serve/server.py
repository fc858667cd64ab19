"""The OpenAI-compatible HTTP server: FastAPI routes over one engine's ``Frontend``.

The routes parse and check the OpenAI bodies (``protocol.py``) and hand them to the
frontend (``frontend.py``: the engine thread, streaming, stop strings, aborts); a client
that disconnects while waiting for a whole answer is noticed within half a second and its
request aborted. ``openai_app`` is the app both this server and the Ray Serve router start
from: the access guard in front (``access.py``: API key, body bound, adapter folders) and
every error as OpenAI's error object — unknown model or route 404, bad field or body 400,
full queue 429. ``listen`` binds the port before anything is loaded or announced.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException

from legato.errors import CheckpointError, ConfigError
from legato.lora.peft_io import load_adapter
from legato.serve.access import Access, Guard
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


def create_app(
    engine: Engine, adapter_paths: dict[str, str] | None = None, access: Access | None = None
) -> FastAPI:
    """The app serving ``engine`` (its base model under ``engine.model_name``, each adapter
    under its own name) behind ``access`` (default: no key, no runtime adapter loading);
    ``app.state.frontend`` is closed on shutdown."""
    access = access or Access()
    frontend = Frontend(engine)
    metrics = frontend.metrics
    paths = dict(adapter_paths or {})

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        frontend.close()

    app = openai_app("legato", access, lifespan)
    app.state.frontend = frontend

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
        folder = access.adapter_folder(body.lora_path)
        if body.lora_name == engine.model_name:
            raise RequestError("lora_name: that is the base model's name", 400, "lora_name")
        try:
            adapter = await asyncio.to_thread(load_adapter, folder, engine.model)
        except (CheckpointError, ConfigError) as exc:
            raise RequestError(f"lora_path: {exc}", 400, "lora_path") from None
        engine.load_adapter(body.lora_name, adapter.eval(), folder)
        paths[body.lora_name] = str(folder)
        return Response(f"Success: LoRA adapter '{body.lora_name}' added successfully.")

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora(body: UnloadLora):
        access.check_updating()
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


def openai_app(title: str, access: Access, lifespan=None) -> FastAPI:
    """A FastAPI app behind ``access``'s guard whose every error is OpenAI's error object:
    a refused request, a body that fails validation (a 400 naming the field, never FastAPI's
    422), a body that is not JSON, an unknown route."""
    app = FastAPI(title=title, lifespan=lifespan)
    app.add_middleware(Guard, access=access)

    @app.exception_handler(RequestError)
    async def _refused(_: Request, exc: RequestError) -> JSONResponse:
        return JSONResponse(error_body(str(exc), exc.status, exc.param), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0]
        if first["type"] == "json_invalid":  # its loc is ("body", character offset)
            where = first["loc"][-1]
            message = (
                f"request body is not valid JSON: {first['ctx']['error']} at character {where}"
            )
            return JSONResponse(error_body(message, 400), status_code=400)
        field = ".".join(str(p) for p in first["loc"][1:]) or "body"
        return JSONResponse(error_body(f"{field}: {first['msg']}", 400, field), status_code=400)

    @app.exception_handler(HTTPException)
    async def _http(_: Request, exc: HTTPException) -> JSONResponse:
        body = error_body(str(exc.detail), exc.status_code)
        return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)

    return app


def listen(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` (not yet listening: the server does that once it
    runs), so a busy port or a bad address is one line naming the flag, before the model
    loads or anything says it serves."""
    if not 0 <= port <= 65535:
        raise ConfigError(f"--port: must be in [0, 65535], got {port}")
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as exc:
        raise ConfigError(f"--host: cannot use {host!r} ({exc.strerror})") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise ConfigError(
            f"--port: cannot listen on {host}:{port} ({exc.strerror}); pick another --port"
        ) from None
    return sock
