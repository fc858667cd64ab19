"""Which communication is exposed: overlap with compute and sharing of link levels.

Each mesh axis's traffic in a step is ``seconds`` of transfers (alone on its link) that may
hide behind ``window`` seconds of compute running at the same time (zero for traffic on
the critical path: tensor parallelism, pipeline sends, or anything with overlap off).
``tail`` is the part that can never hide (the first FSDP gather, the last gradient
bucket).

Axes whose slowest link is the same level share it. Overlapped traffic on a level is
pooled: it hides behind the longest window among them and the remainder is exposed,
split in proportion to each axis's traffic. Critical traffic on a level that also carries
hidden background traffic gets a fair half of the link while both are active: the part of
it that falls inside the window (``window / span`` of it, ``span`` being the step's
compute, over which critical traffic is spread) is slowed by ``1 + u``, ``u`` the share of
the window the background traffic keeps busy. That delay is charged to the background axes
that cause it (in proportion to their traffic); it is at most their hidden traffic (while
both run, each gets half the link), so no axis is exposed for longer than its own traffic
takes alone.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Traffic:
    axis: str
    level: str  # name of the slowest link level the axis crosses
    seconds: float
    window: float = 0.0
    tail: float = 0.0


def exposed_seconds(traffic: list[Traffic], span: float) -> dict[str, float]:
    """Exposed seconds of each axis (critical traffic included, slowed by sharing) in a
    step whose compute lasts ``span`` seconds."""
    exposed: dict[str, float] = {}
    for level in {x.level for x in traffic}:
        on_level = [x for x in traffic if x.level == level]
        background = [x for x in on_level if x.window > 0]
        pooled = sum(x.seconds for x in background)
        window = max((x.window for x in background), default=0.0)
        left = max(0.0, pooled - window)
        busy = min(1.0, (pooled - left) / window) if window > 0 else 0.0
        busy *= min(1.0, window / span) if span > 0 else 1.0
        # sharing the link delays the critical traffic by at most the background traffic
        # that overlaps it, the hidden part (each then gets half the link)
        delay = min(busy * sum(x.seconds for x in on_level if x.window <= 0), pooled - left)
        for x in on_level:
            if x.window > 0:
                share = left * x.seconds / pooled if pooled > 0 else 0.0
                # the critical traffic it slows is charged to it, so that no axis is
                # exposed for longer than its own traffic takes alone
                value = max(min(x.tail, x.seconds), share) + delay * x.seconds / pooled
            else:
                value = x.seconds
            exposed[x.axis] = exposed.get(x.axis, 0.0) + value
    return exposed
