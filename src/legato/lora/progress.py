"""Per-task progress of a fine-tuning run: a rich bar per task on a terminal, lines otherwise.

``legato.train.progress`` shows one job's steps; here several tasks advance at their own
pace and join or leave mid-run, so each gets its own bar (or its own log lines).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TextIO

from legato.lora.trainer import TaskStepRecord


def describe(r: TaskStepRecord) -> str:
    width = len(str(r.total_steps))
    return (
        f"[{r.task}] step {r.step:>{width}}/{r.total_steps}  loss {r.loss:.4f}  "
        f"lr {r.lr:.2e}  {r.tokens / max(r.seconds, 1e-9):,.0f} tok/s"
    )


class TaskProgress:
    """Shows task steps; ``log_every`` thins plain lines (first and last always shown)."""

    def __init__(self, log_every: int = 10, stream: TextIO | None = None) -> None:
        self.log_every = log_every
        self.stream = stream or sys.stdout
        self._bar = None
        self._ids: dict[str, int] = {}
        if self.stream.isatty():
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

            self._bar = Progress(
                TextColumn("{task.fields[name]:<16}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.description}"),
                console=Console(file=self.stream),
            )
            self._bar.start()

    def add(self, name: str, total_steps: int) -> None:
        if self._bar is not None:
            self._ids[name] = self._bar.add_task("waiting", total=total_steps, name=name)

    def update(self, r: TaskStepRecord) -> None:
        if self._bar is not None:
            text = f"loss {r.loss:.4f}  {r.tokens / max(r.seconds, 1e-9):,.0f} tok/s"
            self._bar.update(self._ids[r.task], completed=r.step, description=text)
        elif r.step % self.log_every == 0 or r.step in (1, r.total_steps):
            print(describe(r), file=self.stream, flush=True)

    def finish(self, name: str, path: Path | None) -> None:
        self.message(f"[{name}] done" + (f": adapter saved to {path}" if path else ""))

    def message(self, text: str) -> None:
        if self._bar is not None:
            self._bar.console.print(text)
        else:
            print(text, file=self.stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
