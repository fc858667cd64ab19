"""Predicted time and exposed communication of one expert-parallel MoE layer under the
overlap schedules of ``legato.moe`` (plain, Domino-EP, Comet), and the gain they give.

The layer on one EP rank, for one micro-batch of ``tokens`` (routing assumed balanced:
every rank sends and receives ``tokens * top_k`` rows, ``1/ep`` of them to itself) is a
list of operations on two resources, the link and the compute units, each serving its
operations in the order the code issues them (NCCL and gloo run a group's collectives in
order; the compute stream runs kernels in order):

* forward: the dispatch all-to-alls of all pieces are issued first; then per piece its
  first GEMMs (after its rows arrived), then per column group its second GEMM and that
  group's combine all-to-all;
* backward: the combine's gradient all-to-alls are issued first (the autograd engine
  reaches all of them at once), then per piece (last first) the GEMMs' input and weight
  gradients and the dispatch's gradient all-to-all.

``plain`` waits for every transfer where it is issued, so nothing overlaps: its time is
the sum. A piece's all-to-all costs ``cost.collectives.collective_time`` (alpha-beta plus
the profile's per-call latency; pass a calibration whose profile has
``call_latency_us = 0`` to model fused kernels such as Comet's, which signal per tile
instead of launching collectives)
and GEMMs cost ``cost.compute.DeviceModel.linear_time`` (small chunks run less
efficiently; fp8 in FP8 training).
Not modelled: routing, permutation copies, and compute slowed by sharing the device with
communication kernels; the predictions are an upper bound on what overlap can gain.

How ``cost.training_step`` uses it (:func:`ep_exposure`): each MoE layer with ``ep > 1`` adds,
per micro-batch, the all-to-all time its schedule (``Strategy.moe_overlap``,
``moe_chunks``, ``moe_groups``; ``none`` is plain) leaves exposed, forward and backward
apart, plus the compute its smaller GEMM pieces lose against the whole GEMMs the block
already counts. The planner tries the schedules as strategies; the runtime takes the same
counts (``legato.moe.Overlap``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from legato.cost.calibration import CALIBRATION, Calibration
from legato.cost.collectives import collective_time
from legato.cost.compute import DeviceModel, Gemm
from legato.specs.device import Link
from legato.specs.model import ModelSpec
from legato.specs.strategy import Strategy

SCHEDULES = ("plain", "domino", "comet")


@dataclass(frozen=True)
class MoEWork:
    """One MoE layer's routed experts on one EP rank: ``tokens`` entering the layer."""

    tokens: float
    hidden: int
    ffn: int
    top_k: int
    num_experts: int
    ep: int
    gated: bool = True

    @classmethod
    def of(cls, model: ModelSpec, tokens: float, ep: int) -> MoEWork:
        moe = model.moe
        if moe is None:
            raise ValueError(f"model {model.name} has no MoE layers")
        return cls(
            tokens,
            model.hidden_size,
            moe.expert_ffn_hidden_size,
            moe.top_k,
            moe.num_experts,
            ep,
            model.mlp == "swiglu",
        )

    @property
    def rows(self) -> float:
        """Rows each rank sends and receives (and computes): one per token and choice."""
        return self.tokens * self.top_k


@dataclass(frozen=True)
class MoETime:
    """Forward + backward seconds of the routed experts and their all-to-alls, and the
    forward's share of each."""

    schedule: str
    chunks: int
    groups: int
    seconds: float
    compute_s: float  # the expert GEMMs alone
    comm_s: float  # the all-to-alls alone on the link
    forward_s: float
    forward_compute_s: float
    forward_comm_s: float

    @property
    def exposed_comm_s(self) -> float:
        return max(0.0, self.seconds - self.compute_s)

    @property
    def exposed_forward_s(self) -> float:
        return max(0.0, self.forward_s - self.forward_compute_s)

    @property
    def exposed_backward_s(self) -> float:
        backward = self.seconds - self.forward_s
        return max(0.0, backward - (self.compute_s - self.forward_compute_s))

    @property
    def hidden_fraction(self) -> float:
        """Share of the communication that runs under compute (0: none, 1: all)."""
        return 1.0 - self.exposed_comm_s / self.comm_s if self.comm_s > 0 else 1.0


@dataclass(frozen=True)
class _Op:
    link: bool  # on the link (else on the compute units)
    seconds: float
    after: int | None = None  # index of an operation it waits for


@dataclass(frozen=True)
class _Piece:
    rows: float  # rows of this piece on each rank
    buffer_rows: float  # all-to-all buffer the rows correspond to (0: stays local)


def _pieces(work: MoEWork, schedule: str, chunks: int) -> list[_Piece]:
    rows = work.rows
    if schedule == "comet" and work.ep > 1:
        local = _Piece(rows / work.ep, 0.0)
        remote = rows * (work.ep - 1) / work.ep / chunks
        return [local] + [_Piece(remote, rows / chunks)] * chunks
    count = chunks if schedule == "domino" else 1
    return [_Piece(rows / count, rows / count)] * count


def _timeline(ops: list[_Op], eager: bool) -> float:
    """Makespan of ``ops`` on two in-order resources; ``eager``: each op also waits for the
    one before it (transfers waited for where they are issued)."""
    free = {True: 0.0, False: 0.0}
    ends: list[float] = []
    for op in ops:
        start = free[op.link]
        if op.after is not None:
            start = max(start, ends[op.after])
        if eager and ends:
            start = max(start, ends[-1])
        ends.append(start + op.seconds)
        free[op.link] = ends[-1]
    return max(ends, default=0.0)


@lru_cache(maxsize=4096)  # pure; the planner times the same layer for many candidates
def moe_layer_time(
    work: MoEWork,
    device: DeviceModel,
    link: Link,
    schedule: str = "plain",
    chunks: int = 1,
    groups: int = 1,
    calibration: Calibration = CALIBRATION,
) -> MoETime:
    """Predicted time of one MoE layer's routed experts under ``schedule``; ``link`` is the
    slowest link the EP group crosses (``ClusterSpec.level_for_group``)."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
    if schedule == "plain":
        chunks = groups = 1
    h, f, local = work.hidden, work.ffn, work.num_experts / work.ep
    n_in = 2 if work.gated else 1
    nbytes = device.dtype_bytes

    def a2a(buffer_rows: float, width: float) -> float:
        return collective_time(
            "all_to_all",
            buffer_rows * width * nbytes,
            work.ep,
            link,
            calibration.profile or device.profile,
        )

    def gemm(g: Gemm, backward: bool) -> float:  # expert GEMMs are block linears (fp8 too)
        return sum(map(device.linear_time, g.backward())) if backward else device.linear_time(g)

    pieces = _pieces(work, schedule, chunks)
    width = h / groups
    forward: list[_Op] = []
    sends = {}
    for i, piece in enumerate(pieces):
        if piece.buffer_rows:
            sends[i] = len(forward)
            forward.append(_Op(True, a2a(piece.buffer_rows, h)))
    backward: list[_Op] = []
    grads = {}
    for i, piece in reversed(list(enumerate(pieces))):
        for g in range(groups):
            if piece.buffer_rows:
                grads[i, g] = len(backward)
                backward.append(_Op(True, a2a(piece.buffer_rows, width)))
    for i, piece in enumerate(pieces):
        m = piece.rows / local
        forward.append(_Op(False, gemm(Gemm(m, n_in * f, h, local), False), sends.get(i)))
        for _ in range(groups):
            forward.append(_Op(False, gemm(Gemm(m, width, f, local), False)))
            if piece.buffer_rows:
                forward.append(_Op(True, a2a(piece.buffer_rows, width), len(forward) - 1))
    for i, piece in reversed(list(enumerate(pieces))):
        m = piece.rows / local
        for g in reversed(range(groups)):
            backward.append(_Op(False, gemm(Gemm(m, width, f, local), True), grads.get((i, g))))
        backward.append(_Op(False, gemm(Gemm(m, n_in * f, h, local), True)))
        if piece.buffer_rows:
            backward.append(_Op(True, a2a(piece.buffer_rows, h), len(backward) - 1))
    eager = schedule == "plain"
    ops = forward + backward
    forward_s = _timeline(forward, eager)
    return MoETime(
        schedule,
        chunks,
        groups,
        seconds=forward_s + _timeline(backward, eager),
        compute_s=sum(op.seconds for op in ops if not op.link),
        comm_s=sum(op.seconds for op in ops if op.link),
        forward_s=forward_s,
        forward_compute_s=sum(op.seconds for op in forward if not op.link),
        forward_comm_s=sum(op.seconds for op in forward if op.link),
    )


def best_schedule(
    work: MoEWork,
    device: DeviceModel,
    link: Link,
    calibration: Calibration = CALIBRATION,
    options: tuple[int, ...] = (1, 2, 4, 8),
) -> MoETime:
    """The fastest of Domino-EP and Comet over chunk and group counts in ``options``, or
    plain when nothing beats it."""
    candidates = [moe_layer_time(work, device, link, "plain", calibration=calibration)]
    for chunks in options:
        if chunks > 1:
            candidates.append(moe_layer_time(work, device, link, "domino", chunks, 1, calibration))
        for groups in options:
            candidates.append(
                moe_layer_time(work, device, link, "comet", chunks, groups, calibration)
            )
    return min(candidates, key=lambda t: t.seconds)


@dataclass(frozen=True)
class OverlapGain:
    """Per-layer and end-to-end speed-up of a schedule over plain (values > 1: faster)."""

    plain: MoETime
    overlapped: MoETime
    other_s: float  # forward + backward of everything but the routed experts, per step
    moe_layers: int

    @property
    def layer(self) -> float:
        return self.plain.seconds / self.overlapped.seconds

    @property
    def end_to_end(self) -> float:
        plain = self.other_s + self.moe_layers * self.plain.seconds
        return plain / (self.other_s + self.moe_layers * self.overlapped.seconds)


def overlap_gain(
    model: ModelSpec,
    device: DeviceModel,
    link: Link,
    tokens: int,
    ep: int,
    dense_flops: float,
    overlapped: MoETime | None = None,
    calibration: Calibration = CALIBRATION,
) -> OverlapGain:
    """Gain of ``overlapped`` (default: :func:`best_schedule`) for ``model`` with ``tokens``
    per EP rank. ``dense_flops``: the step's forward+backward FLOPs other than the routed
    experts on one rank (e.g. ``3 * forward_flops(...)`` minus the routed part), run at
    the large-GEMM efficiency."""
    work = MoEWork.of(model, tokens, ep)
    plain = moe_layer_time(work, device, link, "plain", calibration=calibration)
    best = overlapped or best_schedule(work, device, link, calibration)
    other = dense_flops / device.gemm_rate(math.inf, math.inf, math.inf)
    return OverlapGain(plain, best, other, model.num_moe_layers)


@dataclass(frozen=True)
class EPExposure:
    """One MoE layer's expert-parallel all-to-alls for one micro-batch on one device under
    the strategy's schedule, against the plain one it replaces."""

    timed: MoETime  # the strategy's schedule (plain when moe_overlap is none)
    plain: MoETime

    @property
    def extra_forward_s(self) -> float:
        """Compute the schedule's smaller GEMM pieces add to the forward (>= 0)."""
        return max(0.0, self.timed.forward_compute_s - self.plain.forward_compute_s)

    @property
    def extra_backward_s(self) -> float:
        timed = self.timed.compute_s - self.timed.forward_compute_s
        return max(0.0, timed - (self.plain.compute_s - self.plain.forward_compute_s))


def ep_exposure(
    model: ModelSpec,
    strategy: Strategy,
    device: DeviceModel,
    link: Link,
    calibration: Calibration = CALIBRATION,
    overlap: bool = True,
) -> EPExposure:
    """The all-to-alls of one MoE layer of ``model`` under ``strategy``: each device
    dispatches its ``mbs * seq / (cp * tp)`` tokens (from its sequence-parallel shard) over
    the ``ep`` group whose slowest link is ``link``. ``overlap=False`` times the plain
    schedule whatever the strategy says."""
    tokens = strategy.mbs * model.seq_len / (strategy.cp * strategy.tp)
    work = MoEWork.of(model, tokens, strategy.ep)
    plain = moe_layer_time(work, device, link, "plain", calibration=calibration)
    if strategy.moe_overlap == "none" or not overlap:
        return EPExposure(plain, plain)
    timed = moe_layer_time(
        work,
        device,
        link,
        strategy.moe_overlap,
        strategy.moe_chunks,
        strategy.moe_groups,
        calibration,
    )
    return EPExposure(timed, plain)
