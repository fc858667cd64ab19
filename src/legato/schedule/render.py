"""Pictures of a simulated schedule: Chrome trace JSON and a PNG timeline.

The trace opens in chrome://tracing or ui.perfetto.dev: one thread per rank, one
complete ("X") event per compute action, named like the compact action form. The PNG
has one band per rank, boxes coloured by kind (odd chunks lighter) and labelled with
micro-batch[.slice]. matplotlib is imported only here, lazily, with the Agg backend.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from legato.atomic import write_atomic, write_text_atomic
from legato.schedule.simulate import SimResult

COLORS = {"F": "#4c72b0", "B": "#dd8452", "W": "#55a868", "BW": "#c44e52"}


def chrome_trace(result: SimResult, time_unit_us: float = 1e6) -> dict[str, Any]:
    """Trace events for ``result``; one time unit of the cost model is ``time_unit_us`` µs."""
    s = result.schedule
    events: list[dict[str, Any]] = [
        {"ph": "M", "pid": 0, "name": "process_name", "args": {"name": f"pipeline {s.name}"}}
    ]
    for d in range(s.stages):
        events.append({"ph": "M", "pid": 0, "tid": d, "name": "thread_name",
                       "args": {"name": f"rank {d}"}})  # fmt: skip
    for d, t in result.compute_actions():
        a = t.action
        events.append({
            "ph": "X", "pid": 0, "tid": d, "name": str(a), "cat": a.kind,
            "ts": t.start * time_unit_us, "dur": (t.end - t.start) * time_unit_us,
            "args": {"microbatch": a.microbatch, "slice": a.seq_slice, "stage": a.stage,
                     "chunk": s.placement.chunk(a.stage), "subtask": a.subtask},
        })  # fmt: skip
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_chrome_trace(result: SimResult, path: str | Path, time_unit_us: float = 1e6) -> None:
    text = json.dumps(chrome_trace(result, time_unit_us))
    write_text_atomic(path, text)


def _lighter(color: str) -> tuple[float, float, float]:
    rgb = [int(color[i : i + 2], 16) / 255 for i in (1, 3, 5)]
    return tuple(c + (1 - c) * 0.45 for c in rgb)  # type: ignore[return-value]


# A timeline is wrapped into rows of at most this width so that it stays readable at
# normal size (an unwrapped 32-micro-batch svpp strip was 6,600 pixels wide).
WIDTH_IN = 14.0
DPI = 110
LABEL_IN_PER_CHAR = 0.05  # width of one character at fontsize 6
MAX_HEIGHT_IN = 12.0


def _wrap_rows(result: SimResult, stages: int) -> int:
    """Rows the time axis is cut into: enough that a typical (median) action is wide
    enough for a label like ``31.3``, bounded by the figure's height."""
    durations = sorted(t.end - t.start for _, t in result.compute_actions())
    typical = durations[len(durations) // 2] if durations else 1.0
    per_row_units = WIDTH_IN * 0.85 * typical / (LABEL_IN_PER_CHAR * 5)
    wanted = math.ceil(max(result.makespan, 1e-12) / max(per_row_units, 1e-12))
    fits = int((MAX_HEIGHT_IN - 1.0) // (0.45 * stages + 0.7))
    return max(1, min(wanted, fits))


def render_timeline_png(result: SimResult, path: str | Path) -> None:
    """One band per rank (rank 0 on top), F/B/W/BW coloured, labelled mb[.slice]; a long
    timeline is wrapped into several rows of at most WIDTH_IN inches, each row a
    consecutive window of time on the same scale."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    s, span = result.schedule, max(result.makespan, 1e-12)
    rows = _wrap_rows(result, s.stages)
    window = span / rows
    width = WIDTH_IN if rows > 1 else min(WIDTH_IN, max(8.0, 0.2 * max(map(len, result.timeline))))
    fig, axes = plt.subplots(
        rows, 1, figsize=(width, rows * (0.45 * s.stages + 0.7) + 1.0), squeeze=False
    )
    inch_per_unit = width * 0.85 / window
    for row, ax in enumerate(axes[:, 0]):
        lo, hi = row * window, (row + 1) * window
        for d, t in result.compute_actions():
            if t.end <= lo or t.start >= hi:
                continue
            a = t.action
            color = (
                COLORS[a.kind] if s.placement.chunk(a.stage) % 2 == 0 else _lighter(COLORS[a.kind])
            )
            y = s.stages - 1 - d
            ax.broken_barh([(t.start, t.end - t.start)], (y - 0.4, 0.8), facecolors=color,
                           edgecolors="white", linewidth=0.3)  # fmt: skip
            label = f"{a.microbatch}.{a.seq_slice}" if s.slices > 1 else str(a.microbatch)
            shown = min(t.end, hi) - max(t.start, lo)
            if shown * inch_per_unit > LABEL_IN_PER_CHAR * len(label):
                x = (max(t.start, lo) + min(t.end, hi)) / 2
                ax.text(x, y, label, ha="center", va="center", fontsize=6)
        ax.set_yticks(range(s.stages), [f"rank {d}" for d in reversed(range(s.stages))])
        ax.tick_params(labelsize=7)
        ax.set_xlim(lo, hi)
        ax.set_ylim(-0.6, s.stages - 0.4)
    axes[-1, 0].set_xlabel("time")
    kinds = sorted({t.action.kind for _, t in result.compute_actions()}, key=list(COLORS).index)
    fig.legend(handles=[Patch(color=COLORS[k], label=k) for k in kinds], loc="upper right",
               ncol=len(kinds), fontsize=8, frameon=False)  # fmt: skip
    wrapped = f"  ({rows} rows of {window:.4g} time units)" if rows > 1 else ""
    fig.suptitle(
        f"{s.name}: p={s.stages} m={s.microbatches} v={s.chunks} k={s.slices}  "
        f"bubble {max(result.bubble_ratio):.1%}  peak {max(result.peak_fraction):.2f} of 1F1B"
        f"{wrapped}",
        x=0.01, ha="left", fontsize=9,
    )  # fmt: skip
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.5 / fig.get_figheight()))
    write_atomic(path, lambda tmp: fig.savefig(tmp, dpi=DPI, format="png"))
    plt.close(fig)
