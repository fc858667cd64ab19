"""Per-task progress of a fine-tuning run: a rich bar per task on a terminal, lines otherwise.

``legato.train.progress`` shows one job's steps; here several tasks advance at their own
pace and join or leave mid-run, so each gets its own bar (or its own log lines).
"""

from __future__ import annotations

from pathlib import Path
from typing import TextIO

from legato.lora.trainer import TaskStepRecord
from legato.train.progress import LiveLines


def describe(r: TaskStepRecord) -> str:
    width = len(str(r.total_steps))
    return (
        f"[{r.task}] step {r.step:>{width}}/{r.total_steps}  loss {r.loss:.4f}  "
        f"lr {r.lr:.2e}  {r.tokens / max(r.seconds, 1e-9):,.0f} tok/s"
    )


class TaskProgress(LiveLines):
    """Shows task steps; ``log_every`` thins plain lines (first and last always shown)."""

    def __init__(self, log_every: int = 10, stream: TextIO | None = None) -> None:
        super().__init__(stream)
        self.log_every = log_every
        self._ids: dict[str, int] = {}
        if self.live:
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn

            self._start_bar(
                TextColumn("{task.fields[name]:<16}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.description}"),
            )

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
