"""One engine's OpenAI answers without HTTP: what the FastAPI app and a Ray Serve replica run.

The engine steps in its own thread (``EngineThread``) so a step's tensor work never blocks
the event loop; each request gets an asyncio queue that the engine thread feeds through the
request's ``on_update`` (``call_soon_threadsafe``). ``Frontend.submit`` checks a body and
queues it at once (so a refusal — unknown model 404, bad field 400, full queue 429 — is
raised before any answer starts); the ``Pending`` it returns is awaited whole or iterated as
server-sent events ending in ``data: [DONE]``, with a usage chunk first when ``stream_options.
include_usage`` asks. Streamed text is held back while it could still turn into a stop string
or ends in half a UTF-8 character. A caller that goes away (a cancelled ``result``, a closed
event stream) aborts its request, which frees its blocks.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from legato.serve.engine import FINISHED, Engine, Request
from legato.serve.metrics import ServerMetrics
from legato.serve.protocol import completion_body, error_body, usage
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


class Frontend:
    """``engine`` behind its thread, answering request bodies (``protocol.py``)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.metrics = ServerMetrics(engine.model_name)
        self.worker = EngineThread(engine, self.metrics)

    def adapter_of(self, model: str) -> str | None:
        if model == self.engine.model_name:
            return None
        if model in self.engine.adapters:
            return model
        raise RequestError(f"model: the model {model!r} does not exist", 404, "model")

    def submit(self, body, chat: bool, adapter: str | None = None) -> Pending:
        """Queue ``body`` (a ``CompletionRequest`` or ``ChatRequest``) for the adapter its
        ``model`` names, or for the engine's ``adapter`` if given; call from the event loop
        that will await the answer. Raises ``RequestError`` for a refused body."""
        prompt = body.prompt_ids(self.engine.tokenizer)
        adapter = adapter or self.adapter_of(body.model)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()

        def on_update(request) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, request.state == FINISHED)

        try:
            params = body.sampling(max(self.engine.max_model_len - len(prompt), 1))
            request = self.worker.submit(prompt, params, adapter, on_update)
        except RequestError as exc:  # about the answer's length: named as the body sent it
            raise exc.sent_as("max_tokens", body.length_field) from None
        return Pending(self.engine, request, queue, body, params.stop, chat)

    def close(self) -> None:
        self.worker.close()


class Pending:
    """A queued request: ``result()`` for the whole answer, ``events()`` for a stream."""

    def __init__(self, engine, request: Request, queue, body, stops, chat: bool) -> None:
        self.engine, self.request, self.queue = engine, request, queue
        self.body, self.stops, self.chat = body, stops, chat

    async def result(self, gone: Callable[[], Awaitable[bool]] | None = None) -> dict | None:
        """The completion body; None (the request aborted) if ``gone()`` turns true while
        waiting. Cancelling the wait aborts the request too."""
        request = self.request
        try:
            while True:
                try:
                    if await asyncio.wait_for(self.queue.get(), _DISCONNECT_POLL_S):
                        break
                except asyncio.TimeoutError:
                    if gone is not None and await gone():
                        self.engine.abort(request)
                        return None
        except asyncio.CancelledError:
            self.engine.abort(request)
            raise
        if request.error:
            raise RequestError(f"the engine failed: {request.error}", 500)
        counts = usage(len(request.prompt), len(request.output))
        return completion_body(request.id, self.body.model, request.text,
                               request.finish_reason, self.chat, counts)  # fmt: skip

    async def events(self) -> AsyncIterator[str]:
        """Server-sent events of the answer, ``data: [DONE]`` last."""
        request, body, chat = self.request, self.body, self.chat
        sent = 0
        try:
            if chat:
                first = completion_body(request.id, body.model, "", None, True, None)
                first["choices"][0]["delta"] = {"role": "assistant", "content": ""}
                yield _event(first)
            done = False
            while not done:
                done = await self.queue.get()
                text = request.text
                upto = len(text) if done else len(text) - _held_back(text, self.stops)
                if upto > sent or done:
                    finish = request.finish_reason if done else None
                    chunk = completion_body(request.id, body.model, text[sent:upto], finish,
                                            chat, None)  # fmt: skip
                    if chat:
                        chunk["choices"][0]["delta"] = {"content": text[sent:upto]}
                    sent = max(sent, upto)
                    yield _event(chunk)
            if request.error:
                yield _event(error_body(request.error, 500))
            if body.include_usage:
                last = completion_body(request.id, body.model, "", None, chat, None)
                last["choices"] = []
                last["usage"] = usage(len(request.prompt), len(request.output))
                yield _event(last)
            yield "data: [DONE]\n\n"
        finally:
            if request.state != FINISHED:  # the caller went away mid-stream
                self.engine.abort(request)


def _event(body: dict[str, Any]) -> str:
    return f"data: {json.dumps(body)}\n\n"
