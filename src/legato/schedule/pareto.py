"""Bubble/memory trade-off of all schedules for one (p, m), and its Pareto front.

Each point is one schedule configuration simulated on the same cost model: x = peak
activation (max over ranks, fraction of 1F1B's stage-0 peak), y = bubble ratio (max over
ranks, idle / makespan). A point is on the front when no other point is at least as
good on both and better on one.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from legato.atomic import write_atomic, write_text_atomic
from legato.schedule.builders import _positive, build_schedule, default_memory_cap, memory_floor
from legato.schedule.costs import CostModel, Costs
from legato.schedule.simulate import simulate
from legato.specs.schedules import SCHEDULE_KINDS


@dataclass(frozen=True)
class ParetoPoint:
    label: str
    schedule: str
    chunks: int
    slices: int
    memory_cap: float | None
    bubble: float
    peak: float
    makespan: float
    on_front: bool = False


_SHORT = {"chunks": "v", "slices": "k", "memory_cap": "cap"}


def _configs(p: int, m: int, chunks: Sequence[int], slices: Sequence[int]) -> list[dict[str, Any]]:
    configs: list[dict[str, Any]] = [{"name": n} for n in ("gpipe", "1f1b", "zb-h1", "zb-v")]
    configs += [{"name": "interleaved", "chunks": v} for v in chunks if v > 1 and m % p == 0]
    configs += [{"name": "seq1f1b", "slices": k} for k in slices if k > 1]
    for v in chunks:
        for k in slices:
            floor, top = memory_floor(v, k), default_memory_cap(p, v, k)
            caps = sorted({round(floor + (top - floor) * t) for t in (0, 0.25, 0.5, 0.75, 1)})
            configs += [{"name": "svpp", "chunks": v, "slices": k, "memory_cap": c} for c in caps]
    return configs


def sweep(
    stages: int,
    microbatches: int,
    *,
    chunks: Sequence[int] = (2,),
    slices: Sequence[int] = (1, 2, 4),
    costs: Costs | None = None,
) -> list[ParetoPoint]:
    """Simulate the classic schedules plus Seq1F1B (each k) and SVPP (each v, k, and caps
    from the dependency floor v*k to the default cap), and mark the Pareto front."""
    _positive("stages", stages)
    _positive("microbatches", microbatches)
    costs = costs or CostModel()
    points = []
    for config in _configs(stages, microbatches, chunks, slices):
        options = {key: value for key, value in config.items() if key != "name"}
        if SCHEDULE_KINDS[config["name"]].cost_driven:
            options["costs"] = costs
        s = build_schedule(config["name"], stages=stages, microbatches=microbatches, **options)
        r = simulate(s, costs)
        label = s.name + "".join(f" {_SHORT[key]}={value}" for key, value in config.items()
                                 if key in _SHORT)  # fmt: skip
        cap = config.get("memory_cap")
        points.append(ParetoPoint(label, s.name, s.chunks, s.slices, cap,
                                  max(r.bubble_ratio), max(r.peak_fraction), r.makespan))  # fmt: skip
    return mark_front(points)


def mark_front(points: Sequence[ParetoPoint]) -> list[ParetoPoint]:
    def dominated(a: ParetoPoint) -> bool:
        return any(
            b.peak <= a.peak + 1e-12 and b.bubble <= a.bubble + 1e-12
            and (b.peak < a.peak - 1e-12 or b.bubble < a.bubble - 1e-12)
            for b in points
        )  # fmt: skip

    return [replace(pt, on_front=not dominated(pt)) for pt in points]


def write_pareto_json(points: Sequence[ParetoPoint], path: str | Path, **header: Any) -> None:
    data = {
        **header,
        "x": "peak activation, fraction of 1F1B stage-0 peak (max over ranks)",
        "y": "bubble ratio, idle / makespan (max over ranks)",
        "points": [asdict(pt) for pt in points],
        "front": [pt.label for pt in sorted(points, key=lambda q: q.peak) if pt.on_front],
    }
    text = json.dumps(data, indent=1)
    write_text_atomic(path, text)


def render_pareto_png(points: Sequence[ParetoPoint], path: str | Path, title: str = "") -> None:
    """Scatter of all points by schedule family, front joined by a step line and labelled."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 6))
    for name in dict.fromkeys(pt.schedule for pt in points):
        group = [pt for pt in points if pt.schedule == name]
        ax.scatter([pt.peak for pt in group], [pt.bubble for pt in group], label=name, s=28)
    front = sorted((pt for pt in points if pt.on_front), key=lambda q: q.peak)
    ax.step([pt.peak for pt in front], [pt.bubble for pt in front], where="post",
            color="black", linewidth=1, label="Pareto front")  # fmt: skip
    for pt in front:
        ax.annotate(pt.label, (pt.peak, pt.bubble), fontsize=7, xytext=(4, 4),
                    textcoords="offset points")  # fmt: skip
    ax.set_xlabel("peak activation (fraction of 1F1B stage-0 peak)")
    ax.set_ylabel("bubble ratio (idle / makespan)")
    ax.set_title(title or "bubble vs memory", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    write_atomic(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    plt.close(fig)
