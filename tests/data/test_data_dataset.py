"""Packing and resumable iteration: no token lost, shifted labels, determinism, resume, DP shares."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from legato.data import PackedDataset, split_tokens
from legato.errors import DataError

SEQ = 8


def stream(n: int = 203, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 258, n).astype(np.uint16)


def run(ds: PackedDataset, steps: int, batch: int, world: int = 1) -> list[torch.Tensor]:
    """The global inputs of ``steps`` batches, gathered over ``world`` simulated ranks."""
    out = []
    for _ in range(steps):
        state = ds.state_dict()
        shares = []
        for rank in range(world):
            ds.load_state_dict(state)  # each rank holds its own copy at the same position
            shares.append(ds.next_batch(batch, rank, world)[0])
        out.append(torch.cat(shares))
    return out


def test_packing_keeps_every_token_and_shifts_labels():
    tokens = stream()
    ds = PackedDataset(tokens, SEQ, seed=0, shuffle=False)
    assert ds.num_sequences == (len(tokens) - 1) // SEQ == 25
    inputs, labels = ds.next_batch(ds.num_sequences)
    assert inputs.dtype == labels.dtype == torch.int64
    assert inputs.shape == labels.shape == (25, SEQ)
    assert torch.equal(inputs[:, 1:], labels[:, :-1])
    assert inputs.flatten().tolist() == tokens[: 25 * SEQ].tolist()
    assert labels.flatten().tolist() == tokens[1 : 25 * SEQ + 1].tolist()
    assert len(tokens) - (25 * SEQ + 1) < SEQ  # only a tail shorter than one sequence is unused


def test_each_epoch_is_a_permutation_of_all_windows():
    ds = PackedDataset(stream(), SEQ, seed=3)
    orders = [ds.order(e).copy() for e in range(3)]
    for order in orders:
        assert sorted(order.tolist()) == list(range(ds.num_sequences))
    assert not np.array_equal(orders[0], orders[1])
    firsts = {tuple(row.tolist()) for row in ds.next_batch(ds.num_sequences)[0]}
    reference = PackedDataset(stream(), SEQ, seed=0, shuffle=False).next_batch(ds.num_sequences)[0]
    assert firsts == {tuple(row.tolist()) for row in reference}
    assert ds.state_dict()["epoch"] == 1 and ds.state_dict()["position"] == 0


def test_deterministic_for_a_seed():
    a = run(PackedDataset(stream(), SEQ, seed=7), 10, 4)
    b = run(PackedDataset(stream(), SEQ, seed=7), 10, 4)
    c = run(PackedDataset(stream(), SEQ, seed=8), 10, 4)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(torch.equal(x, y) for x, y in zip(a, c, strict=True))


def test_world_size_does_not_change_the_global_batch():
    one = run(PackedDataset(stream(), SEQ, seed=1), 12, 6, world=1)
    two = run(PackedDataset(stream(), SEQ, seed=1), 12, 6, world=2)
    three = run(PackedDataset(stream(), SEQ, seed=1), 12, 6, world=3)
    assert all(
        torch.equal(x, y) and torch.equal(x, z) for x, y, z in zip(one, two, three, strict=True)
    )
    inputs, labels = PackedDataset(stream(), SEQ, seed=1).next_batch(6, rank=1, world=2)
    assert inputs.shape == labels.shape == (3, SEQ)


@pytest.mark.parametrize("k", [2, 6, 7, 13])  # 25 windows, batch 4: epochs roll at steps 6-7, 12-13
def test_resume_matches_an_uninterrupted_run(k):
    full = run(PackedDataset(stream(), SEQ, seed=5), 16, 4)
    first = PackedDataset(stream(), SEQ, seed=5)
    run(first, k, 4)
    state = json.loads(json.dumps(first.state_dict()))  # must survive JSON
    resumed = PackedDataset(stream(), SEQ, seed=5)
    resumed.load_state_dict(state)
    rest = run(resumed, 16 - k, 4)
    assert all(torch.equal(x, y) for x, y in zip(full[k:], rest, strict=True))


def test_batch_larger_than_an_epoch_rolls_over():
    ds = PackedDataset(stream(50), SEQ, seed=0, shuffle=False)  # 6 windows
    inputs, _ = ds.next_batch(8)
    assert torch.equal(inputs[6:], inputs[:2])
    assert (ds.epoch, ds.position) == (1, 2)


def test_state_of_another_dataset_is_refused():
    ds = PackedDataset(stream(), SEQ, seed=0)
    state = ds.state_dict()
    with pytest.raises(DataError, match=r"another dataset: fingerprint .*"):
        PackedDataset(stream(seed=1), SEQ, seed=0).load_state_dict(state)
    with pytest.raises(DataError, match=r"num_tokens 203 \(checkpoint\) != 300 \(now\)"):
        PackedDataset(stream(300), SEQ, seed=0).load_state_dict(state)
    with pytest.raises(DataError, match=r"seq_len 8 \(checkpoint\) != 4 \(now\)"):
        PackedDataset(stream(), 4, seed=0).load_state_dict(state)
    with pytest.raises(DataError, match=r"seed 0 \(checkpoint\) != 9 \(now\)"):
        PackedDataset(stream(), SEQ, seed=9).load_state_dict(state)
    with pytest.raises(DataError, match="missing position"):
        ds.load_state_dict({k: v for k, v in state.items() if k != "position"})
    with pytest.raises(DataError, match=r"position must be in 0..24"):
        ds.load_state_dict({**state, "position": 25})


def test_bad_arguments():
    with pytest.raises(
        DataError, match=r"10 tokens are fewer than one sequence of seq_len \+ 1 = 17"
    ):
        PackedDataset(stream(10), 16, seed=0)
    ds = PackedDataset(stream(), SEQ, seed=0)
    with pytest.raises(DataError, match="6 is not divisible by the 4 data-parallel ranks"):
        ds.next_batch(6, rank=0, world=4)
    with pytest.raises(DataError, match="rank 2 is not in a world of size 2"):
        ds.next_batch(4, rank=2, world=2)
    with pytest.raises(DataError, match="positive integer"):
        ds.next_batch(0)
    assert ds.state_dict()["position"] == 0  # failed calls consume nothing


def test_fingerprint_of_large_streams_is_sampled_but_sensitive():
    big = np.zeros(10_000_000, dtype=np.uint16)
    a = PackedDataset(big, 256, seed=0).fingerprint
    changed = big.copy()
    changed[-1] = 7
    assert PackedDataset(big.copy(), 256, seed=0).fingerprint == a
    assert PackedDataset(changed, 256, seed=0).fingerprint != a


def test_split_tokens():
    tokens = stream(1000)
    train, val = split_tokens(tokens, 0.1)
    assert (len(train), len(val)) == (900, 100)
    assert np.array_equal(np.concatenate([train, val]), tokens)
    with pytest.raises(DataError, match=r"data\.holdout"):
        split_tokens(tokens, 1.0)


def test_uneven_split_serves_the_global_batch_in_rank_order():
    ds = PackedDataset(stream(), SEQ, seed=2)
    state = ds.state_dict()
    whole = ds.next_batch(8)[0]
    shares = []
    for rank in range(2):
        ds.load_state_dict(state)
        shares.append(ds.next_batch(8, rank, 2, split=[5, 3])[0])
    assert [len(s) for s in shares] == [5, 3]
    assert torch.equal(torch.cat(shares), whole)
    assert ds.state_dict()["position"] == 8  # the whole global batch is consumed
    with pytest.raises(
        DataError, match=r"train.batch_split: must have 2 entries >= 1 summing to 8"
    ):
        ds.next_batch(8, 0, 2, split=[5, 2])


def test_any_split_resumes_without_lost_or_repeated_windows():
    even = run(PackedDataset(stream(), SEQ, seed=4), 9, 4)
    ds, got = PackedDataset(stream(), SEQ, seed=4), []
    for step, split in enumerate([[2, 2], [3, 1], [1, 3]] * 3):
        state = ds.state_dict()
        fresh = PackedDataset(stream(), SEQ, seed=4)  # as after a restart from a checkpoint
        shares = []
        for rank in range(2):
            fresh.load_state_dict(state)
            shares.append(fresh.next_batch(4, rank, 2, split=split)[0])
        ds.load_state_dict(fresh.state_dict())
        got.append(torch.cat(shares))
        assert torch.equal(got[step], even[step])


@pytest.mark.parametrize("rows", [1, 3])
def test_inputs_and_labels_never_share_memory(rows):
    """A one-row window's two slices are both contiguous, so ``contiguous()`` used to copy
    neither and labels.fill_ wrote into the inputs (the evaluation crash of issue 27)."""
    ds = PackedDataset(stream(), SEQ, seed=0, shuffle=False)
    inputs, labels = ds.windows(np.arange(rows))
    before = inputs.clone()
    labels.fill_(-100)
    assert torch.equal(inputs, before)
    assert inputs.is_contiguous() and labels.is_contiguous()
