"""Execute a schedule on a cost model: timeline, makespan, bubbles, peak activation memory.

Each rank runs its actions in order. A compute action starts when its rank is free and
its inputs are there; a send is asynchronous and its message arrives ``message_time``
later; a receive blocks until its message has arrived. If no rank can progress, the
schedule deadlocks and the error lists each blocked rank's next action and what it
waits for.

Definitions (per rank r, ``busy[r]`` = its total compute time, makespan = end of the last
action, time starts at 0):

* ``bubble_ratio[r]`` = (makespan - busy[r]) / makespan, idle over the step time; the
  form of the 1F1B closed form (p-1)/(m+p-1);
* ``bubble_vs_ideal[r]`` = (makespan - busy[r]) / busy[r], idle over ideal compute; the
  form of the interleaved (p-1)/(v m) and zero-bubble (p-1)/(3m) formulas;
* a unit's activations are held from the start of its F to the end of its last W (or
  its BW); ``peak_units[r]`` is the most slice units held at once, and
  ``peak_fraction[r]`` that divided by 1F1B's stage-0 peak, p micro-batches = p v k units.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from legato.schedule.costs import CostModel, Costs
from legato.schedule.dependencies import attached_compute, matching, message_of, producers
from legato.schedule.errors import ScheduleError
from legato.schedule.ir import Action, Schedule


@dataclass(frozen=True)
class TimedAction:
    action: Action
    start: float
    end: float


def _blocker(
    a: Action, s: Schedule, done: dict[Action, float], received: set[Action]
) -> str | None:
    """What ``a`` still waits for, or None when it can run now."""
    if a.kind.startswith("RECV"):
        send = matching(a)
        return None if a in done else f"{send} (rank {s.placement.rank(send.stage)})"
    if a.kind.startswith("SEND"):
        need = attached_compute(a, s)
        return None if need in done else str(need)
    for p in producers(a, s):
        msg = message_of(p, a, s)
        if msg and msg[1] not in received:
            return str(msg[1])
        if not msg and p not in done:
            return str(p)
    return None


def execute(s: Schedule, costs: Costs) -> tuple[list[list[TimedAction]], str | None]:
    """Run the per-rank lists in order; return the compute timeline and, when the
    schedule deadlocks, a one-line description of the blocked ranks."""
    p = s.stages
    done: dict[Action, float] = {}  # compute -> end; RECV -> arrival of its message
    received: set[Action] = set()  # RECVs this rank has passed
    pos, clock = [0] * p, [0.0] * p
    timeline: list[list[TimedAction]] = [[] for _ in range(p)]
    progress = True
    while progress:
        progress = False
        for d in range(p):
            actions = s.ranks[d]
            while pos[d] < len(actions):
                a = actions[pos[d]]
                if _blocker(a, s, done, received) is not None:
                    break
                progress = True
                pos[d] += 1
                if a.kind.startswith("SEND"):
                    done[matching(a)] = clock[d] + costs.message_time(a.seq_slice, s)
                elif a.kind.startswith("RECV"):
                    clock[d] = max(clock[d], done[a])
                    received.add(a)
                else:
                    start = clock[d]
                    clock[d] = start + costs.duration(a, s)
                    done[a] = clock[d]
                    timeline[d].append(TimedAction(a, start, clock[d]))
    blocked = [
        f"rank {d} at {s.ranks[d][pos[d]]} waits for "
        f"{_blocker(s.ranks[d][pos[d]], s, done, received)}"
        for d in range(p)
        if pos[d] < len(s.ranks[d])
    ]
    return timeline, ("deadlock: " + "; ".join(blocked)) if blocked else None


def _peak(s: Schedule, rank: list[TimedAction]) -> float:
    """Most slice units held at once: from a unit's F start to its last W/BW end."""
    events: list[tuple[float, float]] = []
    release: dict[tuple[int, int, int], float] = {}
    for t in rank:
        weight = s.unit_weight(t.action.seq_slice)
        if t.action.kind == "F":
            events.append((t.start, weight))
        elif t.action.kind in ("W", "BW"):
            release[t.action.unit] = max(release.get(t.action.unit, t.end), t.end)
    events += [(end, -s.unit_weight(unit[1])) for unit, end in release.items()]
    held = peak = 0.0
    for _, delta in sorted(events):  # at equal times frees (negative) come first
        held += delta
        peak = max(peak, held)
    return peak


@dataclass(frozen=True)
class SimResult:
    """Timeline and metrics of one simulated schedule (definitions in the module doc)."""

    schedule: Schedule
    timeline: tuple[tuple[TimedAction, ...], ...]
    makespan: float
    busy: tuple[float, ...]
    peak_units: tuple[float, ...]
    microbatch_activation_bytes: float = 0.0

    @property
    def bubble_ratio(self) -> tuple[float, ...]:
        return tuple((self.makespan - b) / self.makespan for b in self.busy)

    @property
    def bubble_vs_ideal(self) -> tuple[float, ...]:
        return tuple((self.makespan - b) / b for b in self.busy)

    @property
    def peak_fraction(self) -> tuple[float, ...]:
        s = self.schedule
        return tuple(u / (s.stages * s.chunks_per_pass * s.slices) for u in self.peak_units)

    @property
    def peak_bytes(self) -> tuple[float, ...] | None:
        if not self.microbatch_activation_bytes:
            return None
        s = self.schedule
        per_unit = self.microbatch_activation_bytes / (s.chunks_per_pass * s.slices)
        return tuple(u * per_unit for u in self.peak_units)

    def compute_actions(self) -> Iterator[tuple[int, TimedAction]]:
        for d, rank in enumerate(self.timeline):
            for t in rank:
                yield d, t

    def to_dict(self) -> dict[str, Any]:
        def stats(values: tuple[float, ...]) -> dict[str, Any]:
            return {"per_rank": list(values), "max": max(values), "mean": sum(values) / len(values)}

        s = self.schedule
        out = {
            "schedule": s.name,
            "stages": s.stages,
            "microbatches": s.microbatches,
            "chunks": s.chunks,
            "slices": s.slices,
            "backward": s.backward,
            "w_subtasks": s.w_subtasks,
            "makespan": self.makespan,
            "busy": list(self.busy),
            "bubble_ratio": stats(self.bubble_ratio),
            "bubble_vs_ideal": stats(self.bubble_vs_ideal),
            "peak_activation": {
                **stats(self.peak_fraction),
                "units": list(self.peak_units),
                "unit": "fraction of 1F1B's stage-0 peak (p micro-batches)",
            },
        }
        if self.peak_bytes is not None:
            out["peak_activation"]["bytes"] = list(self.peak_bytes)
        return out


def simulate(s: Schedule, costs: Costs | None = None) -> SimResult:
    """Simulate ``s``; raises ``ScheduleError`` on deadlock. Run ``validate`` first on
    schedules that were not made by a builder."""
    costs = costs or CostModel()
    timeline, deadlock = execute(s, costs)
    if deadlock:
        raise ScheduleError(f"schedule {s.name}: {deadlock}")
    ends = [t.end for rank in timeline for t in rank]
    return SimResult(
        schedule=s,
        timeline=tuple(tuple(rank) for rank in timeline),
        makespan=max(ends, default=0.0),
        busy=tuple(sum(t.end - t.start for t in rank) for rank in timeline),
        peak_units=tuple(_peak(s, rank) for rank in timeline),
        microbatch_activation_bytes=costs.microbatch_activation_bytes,
    )
