"""Fixed per-rank forward/backward orders of the classic schedules.

Each function returns, per rank, the sequence of F and backward (B or BW) actions;
W passes, when split, are placed afterwards by the list scheduler. Notation: p ranks,
m micro-batches, v chunks, k slices; ``bk`` is the backward kind ("B" or "BW").
"""

from __future__ import annotations

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
