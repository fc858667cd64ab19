"""Who may call a server and what a caller may send: one guard for the single server and the
Ray Serve router, modelled on vLLM's (``--api-key``, ``VLLM_ALLOW_RUNTIME_LORA_UPDATING``).

Whoever reaches the port can call an unguarded server; with ``--host 0.0.0.0`` or behind a
proxy that is everyone on the network. So:

- with an API key, every ``/v1`` route needs ``Authorization: Bearer KEY`` (compared in
  constant time), else 401; ``/health`` and ``/metrics`` stay open, as in vLLM, for probes
  and scrapers;
- a request body is read whole, up to ``max_request_bytes`` (else 413), and must be UTF-8
  (else 400) before any route parses it;
- loading an adapter reads a folder on the server's disk, so loading and unloading at run
  time are off unless enabled, and then read only from under the ``lora_roots`` folders,
  checked on resolved paths so that neither ``..`` nor a symlink leads out of them.

Refusals are OpenAI error objects (``protocol.error_body``), as every other answer is.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from pathlib import Path

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from legato.errors import ConfigError
from legato.serve.protocol import error_body
from legato.serve.sampling import RequestError

DEFAULT_MAX_REQUEST_BYTES = 4 * 2**20  # a whole context of token ids as JSON fits many times


@dataclass(frozen=True)
class Access:
    """What the guard enforces; built from ``legato serve``'s flags (named in its errors)."""

    api_key: str | None = None
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    lora_updating: bool = False
    lora_roots: tuple[Path, ...] = ()

    def __post_init__(self) -> None:
        if self.api_key is not None and not self.api_key:
            raise ConfigError("--api-key: must not be empty (leave it out to serve without one)")
        if self.max_request_bytes < 1:
            raise ConfigError(f"--max-request-bytes: must be >= 1, got {self.max_request_bytes}")
        if self.lora_updating and not self.lora_roots:
            raise ConfigError(
                "--lora-root: --enable-lora-updating needs at least one --lora-root DIR "
                "(adapters are loaded only from under those folders)"
            )
        if self.lora_roots and not self.lora_updating:
            raise ConfigError("--lora-root: only used with --enable-lora-updating")
        roots = tuple(Path(root).expanduser().resolve() for root in self.lora_roots)
        for root in roots:
            if not root.is_dir():
                raise ConfigError(f"--lora-root: {root} is not a directory")
        object.__setattr__(self, "lora_roots", roots)

    def authorized(self, header: bytes | None) -> bool:
        """Whether an ``Authorization`` header value carries the key (constant time)."""
        if self.api_key is None:
            return True
        return hmac.compare_digest(header or b"", b"Bearer " + self.api_key.encode())

    def check_updating(self) -> None:
        """Refuse a runtime adapter load or unload unless the server enabled them."""
        if not self.lora_updating:
            raise RequestError(
                "runtime LoRA loading and unloading are off: start the server with "
                "--enable-lora-updating --lora-root DIR", 404,
            )  # fmt: skip

    def adapter_folder(self, lora_path: str) -> Path:
        """The resolved folder a runtime load of ``lora_path`` may read: under a lora root,
        and so is every file in it (a symlinked weights file could point anywhere)."""
        self.check_updating()
        folder = Path(lora_path).expanduser().resolve()
        try:
            files = [f.resolve() for f in folder.iterdir()] if folder.is_dir() else []
        except OSError:  # unreadable: the load itself says so
            files = []
        for path in (folder, *files):
            if not any(path.is_relative_to(root) for root in self.lora_roots):
                raise RequestError(f"lora_path: {lora_path} is not inside the server's "
                                   "--lora-root folders", 400, "lora_path")  # fmt: skip
        return folder


class Guard:
    """ASGI middleware enforcing an ``Access`` before the app sees a request."""

    def __init__(self, app: ASGIApp, access: Access) -> None:
        self.app, self.access = app, access

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        if scope["path"].startswith("/v1") and not self.access.authorized(
            headers.get(b"authorization")
        ):
            refusal = RequestError("Authorization: a valid API key is required (a header "
                                   "'Authorization: Bearer KEY')", 401)  # fmt: skip
            await _refuse(scope, receive, send, refusal)
            return
        body = await self._body(headers, receive)
        if body is None:  # the client went away while sending
            return
        if isinstance(body, RequestError):
            await _refuse(scope, receive, send, body)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:  # the body was given once; what follows is a disconnect
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    async def _body(self, headers: dict, receive: Receive) -> bytes | RequestError | None:
        """The whole body; the refusal if it is too large or not UTF-8; None if the client
        disconnected."""
        limit = self.access.max_request_bytes
        too_large = RequestError(f"request body: larger than the server's limit of {limit} "
                                 "bytes (--max-request-bytes)", 413)  # fmt: skip
        declared = headers.get(b"content-length", b"")
        if declared.isdigit() and int(declared) > limit:
            return too_large
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                return too_large
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        try:
            body.decode("utf-8")
        except UnicodeDecodeError as exc:
            return RequestError(
                f"request body is not valid UTF-8: {exc.reason} at byte {exc.start}", 400
            )
        return body


async def _refuse(scope: Scope, receive: Receive, send: Send, refusal: RequestError) -> None:
    status = refusal.status
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    body = error_body(str(refusal), status, refusal.param)
    await JSONResponse(body, status_code=status, headers=headers)(scope, receive, send)
