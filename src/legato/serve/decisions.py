"""What the engine decided in each step, as data: the log ``legato serve --decision-log``
writes and ``legato serve simulate`` reproduces.

One record per engine step (a call of ``Engine.step``, whether it ran a batch or found
nothing to run): the requests that arrived, were admitted, preempted and finished (by
their engine sequence number, the order they were added in), the batch (request and new
tokens), the KV blocks and adapters the pool policy evicted, the KV blocks kept on the
host, the copies started over the link (an adapter and its blocks, or host KV blocks) and
those that landed, and ``t`` = [start, end] of the step on the engine's clock. Everything
but ``t`` is a decision; ``t`` is what a replay takes as the measured step time
(``simulate.MeasuredSteps``). Two logs of the same decisions compare equal by
``decisions``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TextIO

TIME_KEY = "t"


class NullLog:
    """The log when none is asked for: every note is dropped."""

    recording = False

    def note(self, kind: str, value) -> None:
        pass

    def end_step(self, step: int, start: float, end: float) -> None:
        pass

    def close(self) -> None:
        pass


class DecisionLog(NullLog):
    """Records in memory (``records``) and, given a path, one JSON line each as they come
    (a server's log survives it)."""

    recording = True

    def __init__(self, path: str | Path | None = None) -> None:
        self.records: list[dict] = []
        self._current: dict = {}
        self._file: TextIO | None = open(path, "w", encoding="utf-8") if path else None  # noqa: SIM115

    def note(self, kind: str, value) -> None:
        self._current.setdefault(kind, []).append(value)

    def end_step(self, step: int, start: float, end: float) -> None:
        record = {"step": step, **self._current, TIME_KEY: [start, end]}
        self._current = {}
        self.records.append(record)
        if self._file is not None:
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def read_log(path: str | Path) -> list[dict]:
    """The records of a decision log file."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def decisions(records: list[dict]) -> list[dict]:
    """``records`` without their times (JSON's lists and tuples compared alike)."""
    return [json.loads(json.dumps({k: v for k, v in r.items() if k != TIME_KEY})) for r in records]
