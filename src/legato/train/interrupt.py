"""Ctrl-C and SIGTERM during ``Trainer.fit()``: stop at a step boundary, never mid-step.

A signal during set-up aborts at once (``Interrupted``): nothing has been trained, and
every file written so far was written atomically. Once the loop runs, a signal only sets
a flag; at the end of each step the ranks agree on it (``Trainer._agree_next_step``), so
all of them stop after the same step, checkpoint it and write the summary and the plot.
A process stopped this way exits with ``EXIT_INTERRUPTED`` (128 + SIGINT, the shell's
code for Ctrl-C), whichever of the two signals it got.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any

from legato.parallel.launch import INTERRUPTED

if TYPE_CHECKING:
    from legato.train.config import TrainConfig

EXIT_INTERRUPTED = INTERRUPTED  # what the launcher expects of a worker that stopped cleanly
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """A stop signal before the first step: the run stopped during set-up."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(
            f"interrupted by {signal.Signals(signum).name} during set-up, before the first "
            "step; nothing was trained or saved"
        )


class StopSignals:
    """Handlers for SIGINT and SIGTERM while ``fit()`` runs; the previous ones are put
    back on exit. Only the main thread can own handlers: elsewhere this does nothing."""

    def __init__(self) -> None:
        self.received: int | None = None
        self._deferred = False
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def defer(self) -> None:
        """From now on a signal only sets ``received``; the loop reads it between steps."""
        self._deferred = True

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """A set-up step no signal may cut in half (taking the run directory's lock and
        registering its release): within the block a signal only sets ``received``, and
        ``Interrupted`` is raised as the block ends, once what it took is accounted for."""
        deferred, self._deferred = self._deferred, True
        try:
            yield
        finally:
            self._deferred = deferred
        if not deferred and self.received is not None:
            raise Interrupted(self.received)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.received = signum
        if not self._deferred:
            raise Interrupted(signum)


def stopped_line(step: int, config: TrainConfig, run_dir: Path, checkpoint: Path | None) -> str:
    """What rank 0 prints after a stop in the loop: where it stopped and how to go on."""
    where = f"interrupted at step {step}/{config.train.steps}"
    if checkpoint is None:
        return f"{where}; nothing saved (checkpoint.every = 0)"
    again = f"--run.dir={run_dir}"
    if config.checkpoint.resume != "auto":
        again += " --checkpoint.resume=auto"
    return f"{where}; checkpoint {checkpoint} saved; to resume, rerun with {again}"
