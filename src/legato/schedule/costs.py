"""How long each action takes and how long a message is in flight.

Convention: ``f``, ``b`` and ``w`` are the times of the forward, input-gradient and
weight-gradient passes of one *whole micro-batch through one whole rank* (all its
layers, all its tokens). An action on one of v chunks and one slice takes its share:
``f / v * slice_work(j)``; a fused BW takes ``(b + w) / v * ...``. (Under DualPipe's
dual placement a micro-batch crosses one of a rank's two chunks: v counts as 1.) So every schedule of
the same (p, m) does the same total work and bubbles compare directly. With the default
f = b = w = 1 a fused backward costs 2 forwards, the classic t_b = 2 t_f.

W has no attention (attention has no weights), so its slice share counts tokens only;
F and B count the causal-attention share ``attention_share`` as in ``slicing``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields

from legato.schedule.errors import ScheduleError
from legato.schedule.ir import Action, Schedule
from legato.schedule.slicing import slice_work

ALIASES = {
    "attn": "attention_share",
    "msg_bytes": "message_bytes",
    "act_bytes": "microbatch_activation_bytes",
}


@dataclass(frozen=True)
class CostModel:
    """Per-kind compute times, P2P latency/bandwidth, and activation sizes.

    ``message_bytes``: bytes of the activation (or its gradient) of one whole micro-batch
    at a stage boundary; a slice's message carries its share of the tokens. A message
    takes ``latency + bytes / bandwidth``. ``microbatch_activation_bytes``: activations one
    micro-batch keeps on one rank (all chunks), to report peak memory in bytes.
    """

    f: float = 1.0
    b: float = 1.0
    w: float = 1.0
    attention_share: float = 0.0
    latency: float = 0.0
    bandwidth: float = math.inf
    message_bytes: float = 0.0
    microbatch_activation_bytes: float = 0.0

    def __post_init__(self) -> None:
        for name in ("f", "b"):
            if not getattr(self, name) > 0:
                raise ScheduleError(f"cost.{name}: must be > 0, got {getattr(self, name)}")
        for name in ("w", "latency", "message_bytes", "microbatch_activation_bytes"):
            if not getattr(self, name) >= 0:
                raise ScheduleError(f"cost.{name}: must be >= 0, got {getattr(self, name)}")
        if not self.bandwidth > 0:
            raise ScheduleError(f"cost.bandwidth: must be > 0, got {self.bandwidth}")
        if not 0.0 <= self.attention_share < 1.0:
            raise ScheduleError(
                f"cost.attention_share: must be in [0, 1), got {self.attention_share}"
            )

    @classmethod
    def parse(cls, text: str) -> CostModel:
        """``"f=1,b=1,w=1,latency=0.1"``: any field name, or the aliases in ``ALIASES``."""
        names = {f.name for f in fields(cls)}
        values: dict[str, float] = {}
        for item in filter(None, (p.strip() for p in text.split(","))):
            key, sep, value = (x.strip() for x in item.partition("="))
            key = ALIASES.get(key, key)
            if not sep or key not in names:
                allowed = ", ".join(sorted(names | set(ALIASES)))
                raise ScheduleError(f"cost: expected name=value with names {allowed}, got {item!r}")
            try:
                values[key] = float(value)
            except ValueError:
                raise ScheduleError(f"cost.{key}: expected a number, got {value!r}") from None
        return cls(**values)

    def duration(self, a: Action, s: Schedule) -> float:
        """Compute time of one action (communication actions take no rank time)."""
        bounds, j, v = s.slice_bounds, a.seq_slice, s.chunks_per_pass
        attn = slice_work(bounds, j, self.attention_share)
        tokens = slice_work(bounds, j, 0.0)
        if a.kind == "F":
            return self.f * attn / v
        if a.kind == "B":
            return self.b * attn / v
        if a.kind == "W":
            return self.w * tokens / v / s.w_subtasks
        if a.kind == "BW":
            return (self.b * attn + self.w * tokens) / v
        return 0.0

    def message_time(self, seq_slice: int, s: Schedule) -> float:
        """Time from a send to the arrival at its receive, for one slice."""
        tokens = slice_work(s.slice_bounds, seq_slice, 0.0)
        return self.latency + self.message_bytes * tokens / self.bandwidth


Durations = Mapping[Action, float] | Callable[[Action], float]


@dataclass(frozen=True)
class MeasuredCosts:
    """Measured per-action durations (e.g. from the runtime's profiler) over a model.

    ``durations`` maps an ``Action`` (or is a function of one) to its time; actions it
    does not cover, and all messages, fall back to ``fallback``.
    """

    durations: Durations
    fallback: CostModel = CostModel()

    def duration(self, a: Action, s: Schedule) -> float:
        if callable(self.durations):
            return float(self.durations(a))
        if a in self.durations:
            return float(self.durations[a])
        return self.fallback.duration(a, s)

    def message_time(self, seq_slice: int, s: Schedule) -> float:
        return self.fallback.message_time(seq_slice, s)

    @property
    def attention_share(self) -> float:
        return self.fallback.attention_share

    @property
    def microbatch_activation_bytes(self) -> float:
        return self.fallback.microbatch_activation_bytes


Costs = CostModel | MeasuredCosts
