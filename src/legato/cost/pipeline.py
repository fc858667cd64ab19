"""Closed forms for pipeline schedules: step time with its bubble, and activation memory.

``p`` stages, ``m`` micro-batches per step, ``v`` model chunks per device, ``k`` sequence
slices per micro-batch. ``t_f`` and ``t_b`` are one micro-batch's forward and backward
time on the slowest device (all of its chunks), ``t_w`` the weight-gradient part of
``t_b``. These are the textbook forms (MEPipe, EuroSys'25; docs/pipeline_schedules.md); ``legato.schedule`` simulates
the exact timeline when the planner wants it.
"""

from __future__ import annotations

from dataclasses import dataclass

from legato.specs.schedules import SCHEDULE_KINDS


@dataclass(frozen=True)
class PipelineTime:
    total_s: float  # time of the m micro-batches, bubble included
    bubble_s: float  # idle time of the slowest device


def pipeline_time(
    schedule: str,
    p: int,
    m: int,
    v: int,
    k: int,
    t_f: float,
    t_b: float,
    t_w: float,
    cap: float = 0,
) -> PipelineTime:
    """Step time of the pipelined forward/backward passes.

    * gpipe, 1f1b: ``(m + p - 1)(t_f + t_b)``;
    * interleaved: ``(m + (p - 1)/v)(t_f + t_b)``;
    * zb-h1 (Qi et al.): bubble ``(p - 1) max(t_f, t_f + t_b' - t_w)`` with ``t_b' = t_b -
      t_w`` the input-gradient part (a third of 1F1B's when the three are equal; never
      below the last stage's wait ``(p - 1) t_f`` for its first forward);
    * zb-2p: ZB-H2's ``(p - 1) max(t_f, t_f + t_b' - 2 t_w)``, at 2p micro-batches of
      memory (equal to ``legato.schedule.simulate``'s makespan; tests/cost);
    * zb-v: two chunks per device in a V; bubble ``(p - 1)(t_f + t_b' - 2 t_w)/2``, zero
      when the three parts are equal, never negative;
    * seq1f1b: slice units of 1/k of a micro-batch: ``(m + (p - 1)/k)(t_f + t_b)``;
    * svpp: slices and chunks: ``(m + (p - 1)/(v k))(t_f + t_b)``. A memory ``cap``
      (slice units per device, 0 = the builder's default) below the round trip of a slice
      unit, ``D = (v p + k - 1)(t_f + t_b - t_w)/(t_f + t_b)`` units, throttles the device
      to ``cap / D`` of its rate (Little's law: W passes need not wait, so only F and
      B' count): the bubble grows by ``m (t_f + t_b)(D / cap - 1)``. Within 35% of
      ``legato.schedule.simulate``'s makespan (tests/cost/test_cost_pipeline.py); the
      default cap is never below ``D``.
    * dualpipe: ``t_f`` etc. are one micro-batch's times on one of the device's two model
      copies (a micro-batch crosses one); bubble ``dualpipe_bubble`` (the longest path
      through DualPipe's order, exact against ``legato.schedule.simulate``).
    """
    work = m * (t_f + t_b)
    if p == 1:
        return PipelineTime(work, 0.0)
    unit = t_f + t_b
    t_bi = t_b - t_w
    bubbles = {
        "gpipe": (p - 1) * unit,
        "1f1b": (p - 1) * unit,
        "interleaved": (p - 1) * unit / v,
        "zb-h1": (p - 1) * max(t_f, t_f + t_bi - t_w),
        "zb-2p": (p - 1) * max(t_f, t_f + t_bi - 2 * t_w),
        "zb-v": (p - 1) * max(0.0, t_f + t_bi - 2 * t_w) / 2,
        "seq1f1b": (p - 1) * unit / k,
        "svpp": (p - 1) * unit / (v * k),
        "dualpipe": dualpipe_bubble(p, t_f, t_bi, t_w),
    }
    bubble = bubbles[schedule]
    if schedule == "svpp" and cap > 0:
        depth = (v * p + k - 1) * (t_f + t_b - t_w) / unit
        bubble += work * max(0.0, depth / cap - 1)
    return PipelineTime(work + bubble, bubble)


def dualpipe_bubble(p: int, f: float, b: float, w: float) -> float:
    """Idle time of every DualPipe device beyond its ``m (f + b + w)`` of work, for
    forward ``f``, input-gradient ``b`` and weight-gradient ``w`` per micro-batch and rank.

    The makespan of a fixed order is its longest dependency path, linear in (f, b, w)
    between the points where another path takes over; with ``n = p/2 - 1`` the seven
    candidate paths of DualPipe's order (``legato.schedule.orders.dualpipe_order``; their
    pieces found as the linear regions of the simulated makespan) give the maximum below.
    The number of micro-batches does not enter: the steady state has no bubble. DeepSeek-V3's
    table gives ``n (F&B + B - 3W)`` with the paired forward and backward F&B overlapping
    each other's communication; with compute alone (F&B = f + b + w) the paths below are
    exact (tests/cost/test_cost_pipeline.py, equal to the simulator over p = 2..16 and
    random, unequal f, b, w). At f = b = w it is ``n f``, against 1F1B's ``(p - 1)(f + b + w)``.
    """
    n = p // 2 - 1
    if n <= 0:
        return 0.0
    paths = (
        n * f,
        n * (f + b - w),
        n * b - f,
        2 * n * b - n * w - f,
        2 * n * f - n * b - n * w,
        2 * n * f - (2 * n + 1) * w,
        (2 * n - 1) * (f - w) + b,
    )
    return max(paths)


def in_flight_microbatches(
    schedule: str, p: int, m: int, v: int, k: int, cap: int = 0, stage: int = 0
) -> float:
    """Micro-batches whose activations (for all of a device's chunks) device ``stage``
    holds at peak, relative to one micro-batch. Stage 0 is the most loaded.

    gpipe holds all ``m``; 1F1B and ZB-H1 hold ``p - stage``; ZB-2p ``2p`` on every device
    (its cap, which the greedy order fills everywhere); ZB-V's V shape gives every
    device 1F1B's stage-0 memory, ``p``; interleaved 1F1B warms up ``2(p - stage - 1) +
    (v - 1) p`` chunk units plus one (``p + (p - 1)/v`` on stage 0, Narayanan et al.);
    DualPipe holds ``p + 1`` micro-batches on one of its two chunks, ``(p + 1)/2`` in units
    of both (DeepSeek-V3, Table 2; the simulator's peak on every device);
    slice-level 1F1B holds ``(p - stage - 1 + k)/k`` (``(p + k - 1)/k`` on stage 0); SVPP
    ``((v + 1) p + k - 2 - 2 stage)/(v k)`` (MEPipe, EuroSys'25, for stage 0; with one chunk
    it is Seq1F1B, as the schedule builder's default cap ``p + k - 1`` says), or ``cap``
    slice units of ``1/(v k)`` each when a memory cap is set. Never more than ``m``.
    """
    if p == 1:
        return 1.0
    capped = schedule == "svpp" and cap > 0
    if v == 1 and schedule == "interleaved":
        schedule = "1f1b"
    if v == 1 and schedule == "svpp":  # one chunk: the builder's order is Seq1F1B's
        schedule = "seq1f1b"
    r = stage
    forms = {
        "gpipe": float(m),
        "1f1b": float(p - r),
        "zb-h1": float(p - r),
        "zb-2p": float(2 * p),
        "zb-v": float(p),
        "interleaved": (2 * (p - r - 1) + (v - 1) * p + 1) / v,
        "seq1f1b": (p - r - 1 + k) / k,
        "svpp": ((v + 1) * p + k - 2 - 2 * r) / (v * k),
        "dualpipe": (p + 1) / 2,
    }
    units = forms[schedule]
    if capped:
        units = min(units, cap / (v * k))
    return min(units, float(m))


def p2p_messages(schedule: str, v: int, k: int) -> int:
    """Point-to-point sends per micro-batch per device in each direction: one per chunk,
    one per slice for the slice-level schedules."""
    kind = SCHEDULE_KINDS[schedule]
    return (k if kind.slices else 1) * kind.chunks_for(v)
