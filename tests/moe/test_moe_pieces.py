"""Cutting the expert-sorted rows into pieces, and the source-major -> expert-major order."""

from __future__ import annotations

import torch

from legato.moe.pieces import (
    expert_major_order,
    inverse,
    local_then_chunks,
    sort_slots,
    token_chunks,
    whole,
)


def _slots(num_tokens=10, top_k=2, experts=4, seed=0):
    scores = torch.rand(num_tokens, experts, generator=torch.Generator().manual_seed(seed))
    weights, indices = scores.topk(top_k, dim=-1)
    counts = torch.bincount(indices.reshape(-1), minlength=experts)
    return sort_slots(indices, weights, experts, counts), indices


def test_sorted_slots_group_rows_by_expert():
    slots, indices = _slots()
    assert torch.equal(slots.experts, slots.experts.sort().values)
    assert torch.equal(
        indices[slots.token_ids].eq(slots.experts[:, None]).any(1), torch.ones(20, dtype=torch.bool)
    )
    assert torch.equal(whole(slots, True)[0].counts, slots.counts)


def _check_partition(pieces, slots):
    rows = torch.cat([p.rows for p in pieces])
    assert torch.equal(rows.sort().values, torch.arange(len(slots.experts)))  # each row once
    for piece in pieces:
        assert torch.equal(piece.rows, piece.rows.sort().values)  # still expert-sorted
        assert torch.equal(piece.counts, torch.bincount(slots.experts[piece.rows], minlength=4))


def test_token_chunks_split_by_token_range():
    slots, _ = _slots()
    pieces = token_chunks(slots, 10, 2, local=False)
    _check_partition(pieces, slots)
    assert (slots.token_ids[pieces[0].rows] < 5).all() and (
        slots.token_ids[pieces[1].rows] >= 5
    ).all()


def test_local_rows_first_then_even_remote_chunks():
    slots, _ = _slots(num_tokens=30)
    pieces = local_then_chunks(slots, rank=1, experts_per_rank=2, chunks=3)
    _check_partition(pieces, slots)
    assert pieces[0].local and not any(p.local for p in pieces[1:])
    assert set(slots.experts[pieces[0].rows].tolist()) <= {2, 3}
    remote = torch.stack([p.counts[:2] for p in pieces[1:]])  # [chunk, expert]
    assert torch.equal(remote.sum(0), slots.counts[:2])
    assert (remote.max(0).values - remote.min(0).values <= 1).all()  # evenly split


def test_expert_major_order_regroups_source_major_rows():
    sizes = [[2, 0, 1], [1, 3, 0]]  # [source][expert]
    labels = [(s, e) for s, row in enumerate(sizes) for e, n in enumerate(row) for _ in range(n)]
    order = expert_major_order(sizes, torch.device("cpu"))
    regrouped = [labels[i] for i in order.tolist()]
    assert regrouped == sorted(labels, key=lambda se: (se[1], se[0]))
    assert torch.equal(order[inverse(order)], torch.arange(len(labels)))
    assert expert_major_order([[4, 0, 2]], torch.device("cpu")) is None
    assert expert_major_order([[0, 0], [0, 0]], torch.device("cpu")).numel() == 0
