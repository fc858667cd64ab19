"""Pictures of a simulated schedule: Chrome trace JSON and a PNG timeline.

The trace opens in chrome://tracing or ui.perfetto.dev: one thread per rank, one
complete ("X") event per compute action, named like the compact action form. The PNG
has one row per rank, boxes coloured by kind (odd chunks lighter) and labelled with
micro-batch[.slice]. matplotlib is imported only here, lazily, with the Agg backend.
"""

from __future__ import annotations

import json
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


def render_timeline_png(result: SimResult, path: str | Path) -> None:
    """One row per rank (rank 0 on top), F/B/W/BW coloured, labelled mb[.slice]."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    s, span = result.schedule, max(result.makespan, 1e-12)
    width = min(60.0, max(10.0, 0.2 * max(len(r) for r in result.timeline)))
    fig, ax = plt.subplots(figsize=(width, 0.5 * s.stages + 1.6))
    inch_per_unit = width * 0.85 / span
    for d, t in result.compute_actions():
        a = t.action
        color = COLORS[a.kind]
        if s.placement.chunk(a.stage) % 2:
            color = _lighter(color)
        y = s.stages - 1 - d
        ax.broken_barh([(t.start, t.end - t.start)], (y - 0.4, 0.8), facecolors=color,
                       edgecolors="white", linewidth=0.3)  # fmt: skip
        label = f"{a.microbatch}.{a.seq_slice}" if s.slices > 1 else str(a.microbatch)
        if (t.end - t.start) * inch_per_unit > 0.06 * len(label):
            ax.text((t.start + t.end) / 2, y, label, ha="center", va="center", fontsize=6)
    ax.set_yticks(range(s.stages), [f"rank {d}" for d in reversed(range(s.stages))])
    ax.set_xlim(0, span)
    ax.set_xlabel("time")
    kinds = sorted({t.action.kind for _, t in result.compute_actions()}, key=list(COLORS).index)
    ax.legend(handles=[Patch(color=COLORS[k], label=k) for k in kinds], loc="upper right",
              bbox_to_anchor=(1.0, 1.25), ncol=len(kinds), fontsize=8, frameon=False)  # fmt: skip
    ax.set_title(
        f"{s.name}: p={s.stages} m={s.microbatches} v={s.chunks} k={s.slices}  "
        f"bubble {max(result.bubble_ratio):.1%}  peak {max(result.peak_fraction):.2f} of 1F1B",
        loc="left", fontsize=9,
    )  # fmt: skip
    fig.tight_layout()
    write_atomic(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    plt.close(fig)
