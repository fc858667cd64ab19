"""What rank 0 shows while training: a live bar on a terminal, plain lines otherwise.

Plain lines every ``log_every`` steps keep logs (CI, ``nohup``, a pipe) readable; a rich
bar on a terminal shows the same numbers without scrolling.
"""

from __future__ import annotations

import sys
from typing import TextIO

from legato.train.metrics import StepMetrics, format_bytes


def describe(m: StepMetrics, total: int) -> str:
    """One line about a step: loss, lr, grad norm, throughput, MFU, memory."""
    parts = [
        f"step {m.step:>{len(str(total))}}/{total}",
        f"loss {m.loss:.4f}",
        f"lr {m.lr:.2e}",
        f"grad {m.grad_norm:.3f}" if m.grad_norm is not None else "skipped (fp16 overflow)",
        f"{m.tokens_per_s:,.0f} tok/s",
    ]
    if m.mfu is not None:
        parts.append(f"mfu {100 * m.mfu:.1f}%")
    parts.append(f"mem {format_bytes(m.peak_memory_bytes)}")
    return "  ".join(parts)


class LiveLines:
    """Output that is a rich live bar on a terminal and plain lines otherwise.

    Shared by the trainer's progress and the fine-tuning runner's per-task progress:
    subclasses call ``_start_bar`` with their columns when ``live`` and print through
    ``message`` so a line never breaks the bar. Silent when not ``enabled``.
    """

    def __init__(self, stream: TextIO | None = None, enabled: bool = True) -> None:
        self.stream = stream or sys.stdout
        self.enabled = enabled
        self._bar = None

    @property
    def live(self) -> bool:
        return self.enabled and self.stream.isatty()

    def _start_bar(self, *columns) -> None:
        from rich.console import Console
        from rich.progress import Progress as RichProgress

        self._bar = RichProgress(*columns, console=Console(file=self.stream))
        self._bar.start()

    def message(self, text: str) -> None:
        """A line that does not break the bar."""
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.console.print(text)
        else:
            print(text, file=self.stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


class Progress(LiveLines):
    """Shows step metrics; silent when not ``enabled`` (every rank but 0)."""

    def __init__(
        self,
        total_steps: int,
        start_step: int,
        log_every: int,
        enabled: bool = True,
        stream: TextIO | None = None,
    ) -> None:
        super().__init__(stream, enabled)
        self.total = total_steps
        self.log_every = log_every
        if self.live:
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn

            self._start_bar(
                TextColumn("train"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeRemainingColumn(),
                TextColumn("{task.description}"),
            )
            self._task = self._bar.add_task("", total=total_steps, completed=start_step)

    def update(self, m: StepMetrics) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            text = f"loss {m.loss:.4f}  {m.tokens_per_s:,.0f} tok/s"
            self._bar.update(self._task, completed=m.step, description=text)
            if m.step % self.log_every == 0 or m.step == self.total:
                self._bar.console.print(describe(m, self.total))
        elif m.step % self.log_every == 0 or m.step == self.total or m.step == 1:
            print(describe(m, self.total), file=self.stream, flush=True)
