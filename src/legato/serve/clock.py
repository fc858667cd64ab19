"""The engine's time: every reading and every wait of the engine, its copy link and its
policies goes through one clock, so the same scheduler runs on the wall clock (``legato
serve``) and on a simulated one (``legato serve simulate``).

The engine reads the clock once when a step begins and once when its batch is done, and
takes every decision of the step at those instants; a copy over the host link lands at the
time the link's bandwidth gives it (``memory.py``), not when a thread happens to finish.
So the decisions are a function of the clock's readings: given the readings of a real run,
a simulation makes the same ones (``tests/serve/test_simulate.py``).
"""

from __future__ import annotations

import time


class WallClock:
    """Seconds of ``time.monotonic`` since ``origin`` (0: the monotonic clock itself, the
    frame the server's metrics read); waits sleep."""

    def __init__(self, origin: float = 0.0) -> None:
        self.origin = origin

    def now(self) -> float:
        return time.monotonic() - self.origin

    def sleep_until(self, when: float) -> None:
        wait = when - self.now()
        if wait > 0:
            time.sleep(wait)


class SimClock:
    """Simulated seconds: they pass only when someone waits (an engine step's duration, an
    idle engine waiting for a copy or for the next arrival)."""

    def __init__(self, start: float = 0.0) -> None:
        self.t = start

    def now(self) -> float:
        return self.t

    def sleep_until(self, when: float) -> None:
        self.t = max(self.t, when)
