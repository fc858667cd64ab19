"""Time-driven list scheduling: turn an ordering policy into per-rank compute orders.

Builders whose order depends on timing (where W passes fill waits in zero-bubble
schedules; SVPP's greedy choice under a memory cap) run this event simulation with the
same cost model as the simulator, so the order they emit reproduces the timeline they
planned. Two policies:

* fixed order: each rank runs its given F/B (or BW) sequence; when the next one is not
  ready yet (or would exceed the memory cap), it runs a pending W (sub)task instead;
* greedy: a ready backward first (oldest micro-batch, last slice first), else the
  oldest ready forward the memory cap admits, else a pending W (sub)task.

Memory is counted in slice units from a unit's F to the end of its last W (or BW).
No micro-batch frees memory on any rank before all of its forwards have run (its first
backward depends on all of them), so a rank full of newer micro-batches can starve the
oldest one's later chunks: plain greedy deadlocks below about 1.5 v k units (the note).
With ``reserve``, a forward of a micro-batch newer than ``mo`` (the oldest micro-batch
with forwards still to run on this rank) is admitted only if the units held by
micro-batches newer than ``mo``, plus one whole micro-batch (v*k units), fit under the
cap. Older micro-batches drain by themselves (backward and W need no memory), after
which ``mo`` has room for all its forwards; when ``mo`` is done here, the next one
inherits the bound. So every cap >= v*k completes.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from legato.schedule.costs import Costs
from legato.schedule.dependencies import consumers, producers, unit_actions
from legato.schedule.errors import ScheduleError
from legato.schedule.ir import Action, Schedule

EPS = 1e-9


@dataclass
class _Rank:
    remaining: list[float]  # per micro-batch: forward slice units not yet started here
    held: list[float]  # per micro-batch: slice units held here (F started, last W not done)
    left: int  # compute actions not yet scheduled here
    order: Sequence[Action] = ()
    pos: int = 0
    free_at: float = 0.0
    used: float = 0.0
    next_time: float = 0.0
    ready: dict[Action, float] = field(default_factory=dict)  # F/B/BW -> inputs-here time
    pending_w: deque[Action] = field(default_factory=deque)
    out: list[tuple[Action, float, float]] = field(default_factory=list)


class ListScheduler:
    """Event simulation that decides, at each free moment of a rank, what it runs next."""

    def __init__(
        self,
        template: Schedule,
        costs: Costs,
        *,
        cap: float = math.inf,
        order: Sequence[Sequence[Action]] | None = None,
        reserve: bool = True,
    ) -> None:
        self.s, self.costs, self.cap, self.reserve = template, costs, cap, reserve
        self.fixed = order is not None
        place, per_unit = template.placement, len(unit_actions(template, 0, 0, 0))
        units_weight = template.chunks_per_pass * sum(
            map(template.unit_weight, range(template.slices))
        )
        self.whole = units_weight  # one micro-batch on one rank: v*k slice units
        m, k = template.microbatches, template.slices
        self.ranks = [
            _Rank([units_weight] * m, [0.0] * m, left=m * template.chunks_per_pass * k * per_unit)
            for _ in range(template.stages)
        ]
        if order is not None:
            for r, seq in zip(self.ranks, order, strict=True):
                r.order = seq
        self.end: dict[Action, float] = {}
        self.w_left: dict[tuple[int, int, int], int] = {}
        for mb in range(m):
            entry = template.route(mb).start
            self.ranks[place.rank(entry)].ready[Action("F", mb, entry, 0)] = 0.0

    # --- decisions -------------------------------------------------------------------
    def _admissible(self, d: int, a: Action) -> bool:
        if a.kind != "F":
            return True
        r, weight = self.ranks[d], self.s.unit_weight(a.seq_slice)
        if r.used + weight > self.cap + EPS:
            return False
        if not self.reserve:
            return True
        oldest = next(mb for mb, left in enumerate(r.remaining) if left > EPS)
        if a.microbatch == oldest:
            return True
        newer = sum(r.held[oldest + 1 :]) + weight
        return newer + self.whole <= self.cap + EPS

    def _candidates(self, d: int) -> list[tuple[Action, float]]:
        r = self.ranks[d]
        if self.fixed:
            nxt = r.order[r.pos] if r.pos < len(r.order) else None
            if nxt in r.ready and self._admissible(d, nxt):
                return [(nxt, r.ready[nxt])]
            return []
        return [(a, t) for a, t in r.ready.items() if self._admissible(d, a)]

    def _next_time(self, d: int) -> float:
        r = self.ranks[d]
        if not r.left:
            return math.inf
        if r.pending_w:
            return r.free_at
        times = [t for _, t in self._candidates(d)]
        return max(r.free_at, min(times)) if times else math.inf

    def _pick(self, d: int, now: float) -> Action:
        r = self.ranks[d]
        ready = [a for a, t in self._candidates(d) if t <= now + EPS]
        backs = [a for a in ready if a.kind != "F"]
        if backs:
            return min(backs, key=lambda a: (a.microbatch, -a.seq_slice))
        if ready:
            return min(ready, key=lambda a: (a.microbatch, a.seq_slice))
        return r.pending_w.popleft()

    # --- effects ---------------------------------------------------------------------
    def _run(self, d: int, a: Action, now: float, dirty: set[int]) -> None:
        r, s = self.ranks[d], self.s
        end = now + self.costs.duration(a, s)
        r.out.append((a, now, end))
        r.free_at, r.left = end, r.left - 1
        self.end[a] = end
        dirty.add(d)
        weight = s.unit_weight(a.seq_slice)
        if a.kind != "W":
            del r.ready[a]
            if self.fixed:
                r.pos += 1
        if a.kind == "F":
            r.used += weight
            r.held[a.microbatch] += weight
            r.remaining[a.microbatch] -= weight
        elif a.kind == "B":
            r.pending_w.extend(
                Action("W", a.microbatch, a.stage, a.seq_slice, g) for g in range(s.w_subtasks)
            )
            self.w_left[a.unit] = s.w_subtasks
        elif a.kind == "W":
            self.w_left[a.unit] -= 1
            if not self.w_left[a.unit]:
                r.used -= weight
                r.held[a.microbatch] -= weight
        else:  # BW
            r.used -= weight
            r.held[a.microbatch] -= weight
        for c in consumers(a, s):
            if c.kind == "W":
                continue
            deps = producers(c, s)
            if all(p in self.end for p in deps):
                owner = s.placement.rank(c.stage)
                self.ranks[owner].ready[c] = max(self._arrival(p, c) for p in deps)
                dirty.add(owner)

    def _arrival(self, p: Action, c: Action) -> float:
        place = self.s.placement
        if place.rank(p.stage) == place.rank(c.stage):
            return self.end[p]
        return self.end[p] + self.costs.message_time(p.seq_slice, self.s)

    def run(self) -> tuple[tuple[tuple[Action, float, float], ...], ...]:
        """Per rank, the compute actions in order with their planned (start, end)."""
        left = sum(r.left for r in self.ranks)
        dirty = set(range(len(self.ranks)))
        while left:
            for d in dirty:
                self.ranks[d].next_time = self._next_time(d)
            dirty.clear()
            d = min(range(len(self.ranks)), key=lambda i: (self.ranks[i].next_time, i))
            now = self.ranks[d].next_time
            if now == math.inf:
                raise ScheduleError(self._deadlock_message())
            self._run(d, self._pick(d, now), now, dirty)
            left -= 1
        return tuple(tuple(r.out) for r in self.ranks)

    def _deadlock_message(self) -> str:
        parts = []
        for d, r in enumerate(self.ranks):
            if not r.left:
                continue
            blocked = [a for a in r.ready if not self._admissible(d, a)]
            if self.fixed and r.pos < len(r.order):
                nxt = r.order[r.pos]
                missing = [str(p) for p in producers(nxt, self.s) if p not in self.end]
                why = f"needs {', '.join(missing)}" if missing else "over the memory cap"
                parts.append(f"rank {d} waits to run {nxt} ({why})")
            elif blocked:
                parts.append(
                    f"rank {d} holds {r.used:g} of {self.cap:g} slice units; "
                    f"{', '.join(map(str, sorted(blocked, key=str)[:3]))} wait for memory"
                )
            else:
                parts.append(f"rank {d} has nothing ready")
        return "schedule deadlocks: " + "; ".join(parts)
