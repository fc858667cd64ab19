"""The packing scheduler: which tasks share the next fused step, and with how many tokens.

Pure Python (no tensors), so it is instant and testable anywhere. Its inputs are a
profiled cost curve of the fused step (seconds vs packed tokens, measured by
``lora.profile``) and a token budget derived from memory. Two decisions:

* **How many tokens to fuse.** Small GEMMs underfeed the hardware, so throughput
  (tokens / cost) first rises with the packed token count, then flattens or even drops
  (caches, memory bandwidth). The target is the largest token count within ``tolerance``
  of the best profiled throughput that also fits the memory budget.
* **Which tasks fill it (load-aware).** Tasks are taken by remaining work, largest first
  (longest-processing-time order, the classic rule for finishing a set of jobs together),
  so long tasks are not left alone at the end where nothing can be fused with them. A
  task contributes whole sequences; one whose optimizer step does not fit is split, and
  its gradient accumulates over fused steps until the step's batch is complete.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class CostProfile:
    """Seconds of one fused forward + backward at a few packed token counts (ascending)."""

    tokens: tuple[int, ...]
    seconds: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.tokens or len(self.tokens) != len(self.seconds):
            raise ValueError("a cost profile needs as many timings as token counts, at least one")
        if any(b <= a for a, b in zip(self.tokens, self.tokens[1:], strict=False)):
            raise ValueError(f"profile token counts must increase, got {self.tokens}")
        if min(self.tokens) <= 0 or min(self.seconds) <= 0:
            raise ValueError("profile token counts and timings must be positive")

    def cost(self, tokens: int) -> float:
        """Piecewise-linear in the measured points; linear extrapolation beyond them."""
        ts, ss = self.tokens, self.seconds
        if len(ts) == 1:
            return ss[0] * tokens / ts[0]
        i = min(max(bisect_left(ts, tokens), 1), len(ts) - 1)
        slope = (ss[i] - ss[i - 1]) / (ts[i] - ts[i - 1])
        return max(ss[i - 1] + slope * (tokens - ts[i - 1]), 1e-12)

    def throughput(self, tokens: int) -> float:
        return tokens / self.cost(tokens)


@dataclass(frozen=True)
class TaskDemand:
    """What a task still needs: sequences left in its current optimizer step, and in total."""

    name: str
    seq_len: int
    sequences: int
    remaining_tokens: int


@dataclass(frozen=True)
class StepPlan:
    take: tuple[tuple[str, int], ...]  # (task, sequences) fused in this step, in pack order
    tokens: int


class PackingScheduler:
    """Plans fused steps under ``max_tokens`` (memory) using ``profile`` (speed)."""

    def __init__(
        self, max_tokens: int, profile: CostProfile | None = None, tolerance: float = 0.05
    ) -> None:
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        self.max_tokens = max_tokens
        self.profile = profile
        self.tolerance = tolerance
        self.target_tokens = self._target()

    def _target(self) -> int:
        """The largest token count within ``tolerance`` of the best throughput that fits."""
        if self.profile is None:
            return self.max_tokens
        points = [t for t in self.profile.tokens if t < self.max_tokens] + [self.max_tokens]
        best = max(self.profile.throughput(t) for t in points)
        good = [t for t in points if self.profile.throughput(t) >= (1 - self.tolerance) * best]
        return max(good)

    def plan(self, demands: Sequence[TaskDemand]) -> StepPlan:
        """The tasks of the next fused step; empty only when nothing is left to do."""
        waiting = [d for d in demands if d.sequences > 0]
        order = sorted(waiting, key=lambda d: (-d.remaining_tokens, d.name))
        take, used = [], 0
        for d in order:
            n = min(d.sequences, (self.target_tokens - used) // d.seq_len)
            if n > 0:
                take.append((d.name, n))
                used += n * d.seq_len
        if not take and order:  # a sequence longer than the target: run it alone
            take, used = [(order[0].name, 1)], order[0].seq_len
        return StepPlan(tuple(take), used)
