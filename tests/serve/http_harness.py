"""A uvicorn server in a thread on a free loopback port, for the tests that need real HTTP
(the ``openai`` client, streamed timings): its start is bounded and it is always stopped,
also when the test fails."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn

START_S = 30.0


@contextmanager
def served(app) -> Iterator[str]:
    """Serve ``app`` (its lifespan run) for the ``with`` block; yields the base URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + START_S
        while not server.started:
            if time.monotonic() > deadline or not thread.is_alive():
                raise RuntimeError(f"the test server did not start within {START_S:.0f} s")
            time.sleep(0.01)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=START_S)
        sock.close()
