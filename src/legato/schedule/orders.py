"""Fixed per-rank forward/backward orders of the classic schedules.

Each function returns, per rank, the sequence of F and backward (B or BW) actions;
W passes, when split, are placed afterwards by the list scheduler (DualPipe's order
places its own). Notation: p ranks,
m micro-batches, v chunks, k slices; ``bk`` is the backward kind ("B" or "BW").
"""

from __future__ import annotations

from collections import deque

from legato.schedule.ir import Action


def gpipe_order(p: int, m: int, bk: str) -> list[list[Action]]:
    """All forwards, then all backwards in micro-batch order."""
    return [
        [Action("F", mb, d) for mb in range(m)] + [Action(bk, mb, d) for mb in range(m)]
        for d in range(p)
    ]


def one_f_one_b_order(p: int, m: int, k: int, bk: str) -> list[list[Action]]:
    """1F1B over slice units (Seq1F1B; plain 1F1B when k = 1).

    Rank d warms up with (p - d - 1) + (k - 1) forwards, then alternates one forward and
    one backward, then drains the backwards. Forwards go slice 0..k-1 of each
    micro-batch; backwards go slice k-1..0 (the reverse-slice rule).
    """
    fwd = [(mb, j) for mb in range(m) for j in range(k)]
    bwd = [(mb, j) for mb in range(m) for j in reversed(range(k))]
    orders = []
    for d in range(p):
        warmup = min(p - d - 1 + k - 1, len(fwd))
        seq = [Action("F", mb, d, j) for mb, j in fwd[:warmup]]
        for i in range(len(fwd) - warmup):
            mb, j = fwd[warmup + i]
            seq.append(Action("F", mb, d, j))
            mb, j = bwd[i]
            seq.append(Action(bk, mb, d, j))
        seq += [Action(bk, mb, d, j) for mb, j in bwd[len(fwd) - warmup :]]
        orders.append(seq)
    return orders


def interleaved_order(p: int, m: int, v: int, bk: str) -> list[list[Action]]:
    """Megatron's interleaved 1F1B (needs m % p == 0; chunk c of rank d is stage c p + d).

    Forwards run in rounds of p micro-batches per chunk (chunk 0 for micro-batches
    0..p-1, chunk 1 for the same, ...); backwards the same with chunks reversed. Rank d
    warms up with 2 (p - d - 1) + (v - 1) p forwards (all of them when m == p).
    """
    total = m * v

    def unit(i: int, forward: bool, d: int) -> tuple[int, int]:
        chunk = (i % (p * v)) // p
        if not forward:
            chunk = v - 1 - chunk
        return (i // (p * v)) * p + i % p, chunk * p + d

    orders = []
    for d in range(p):
        warmup = total if m == p else min(2 * (p - d - 1) + (v - 1) * p, total)
        seq = [Action("F", *unit(i, True, d)) for i in range(warmup)]
        for i in range(total - warmup):
            seq.append(Action("F", *unit(warmup + i, True, d)))
            seq.append(Action(bk, *unit(i, False, d)))
        seq += [Action(bk, *unit(i, False, d)) for i in range(total - warmup, total)]
        orders.append(seq)
    return orders


def dualpipe_order(p: int, m: int, w_subtasks: int = 1) -> list[list[Action]]:
    """DualPipe (DeepSeek-V3): micro-batches enter from both ends, F, B and W all placed.

    Rank d holds stage d of the model's first copy (chunk 0) and stage p - 1 - d of the
    second (chunk 1, virtual stage 2p - 1 - d); micro-batches 0..m/2-1 run the first copy
    from rank 0 down, m/2..m-1 the second from rank p - 1 up. Each rank calls the copy
    whose micro-batches enter on its own side of the middle its phase 0. The eight steps
    follow the DualPipe reference schedule (``DualPipe.step``): warm-up forwards, forward
    pairs, zero-bubble B/W/F, the main F0 B1 F1 B0 steady state, then the drain, whose
    second half and tail defer W into the waits. A backward that does not defer its W
    runs it right after (a fused backward, the same time); a W is ``w_subtasks`` actions.
    """
    return [_DualPipeRank(p, m, d, w_subtasks).order() for d in range(p)]


class _DualPipeRank:
    """One rank's DualPipe order, built step by step (the reference's phase counters)."""

    def __init__(self, p: int, m: int, rank: int, w_subtasks: int) -> None:
        self.p, self.h, self.g = p, m // 2, w_subtasks
        self.second = rank >= p // 2  # phase 0 is the second copy's direction there
        self.half_rank = min(rank, p - 1 - rank)
        self.stage = (rank, 2 * p - 1 - rank)  # per direction
        self.first_mb = (0, self.h)
        self.f_next, self.b_next = [0, 0], [0, 0]
        self.deferred: deque[list[Action]] = deque()
        self.seq: list[Action] = []

    def forward(self, phase: int) -> None:
        d = phase ^ self.second
        self.seq.append(Action("F", self.first_mb[d] + self.f_next[d], self.stage[d]))
        self.f_next[d] += 1

    def backward(self, phase: int, defer_w: bool = False) -> None:
        d = phase ^ self.second
        mb = self.first_mb[d] + self.b_next[d]
        self.b_next[d] += 1
        self.seq.append(Action("B", mb, self.stage[d]))
        ws = [Action("W", mb, self.stage[d], 0, g) for g in range(self.g)]
        if defer_w:
            self.deferred.append(ws)
        else:
            self.seq.extend(ws)

    def weight(self) -> None:
        self.seq.extend(self.deferred.popleft())

    def order(self) -> list[Action]:
        hr = self.half_rank
        tail = self.p // 2 - hr - 1
        for _ in range(2 * tail):  # 1: nF0
            self.forward(0)
        for _ in range(hr + 1):  # 2: nF0F1
            self.forward(0)
            self.forward(1)
        for _ in range(tail):  # 3: nB1W1F1
            self.backward(1, defer_w=True)
            self.weight()
            self.forward(1)
        for _ in range(self.h - self.p + hr + 1):  # 4: nF0B1F1B0
            self.forward(0)
            self.backward(1)
            self.forward(1)
            self.backward(0)
        for _ in range(tail):  # 5: nB1F1B0
            self.backward(1)
            self.forward(1)
            self.backward(0)
        defer = False
        for i in range(hr + 1):  # 6: nB1B0, the second half deferring W
            defer = defer or (i == (hr + 1) // 2 and hr % 2 == 1)
            self.backward(1, defer)
            defer = defer or (i == (hr + 1) // 2 and hr % 2 == 0)
            self.backward(0, defer)
        for _ in range(tail):  # 7: nWB0
            self.weight()
            self.backward(0, defer_w=True)
        for _ in range(hr + 1):  # 8: nW
            self.weight()
        return self.seq
