"""Variable-length packing: per-document attention equals running documents separately,
little padding, and data-parallel shares balanced by tokens."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from legato.data import ByteTokenizer, prepare_tokens
from legato.data.varlen import (
    IGNORE_INDEX,
    VarlenDataset,
    balance_by_tokens,
    build_batch,
    pack_best_fit,
    split_documents,
)
from legato.errors import DataError
from legato.models import build_model
from legato.specs import load_model

EOS, PAD = 256, 257


def _docs(*lengths: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [np.append(rng.integers(0, 256, n - 1), EOS) for n in lengths]


def test_split_cuts_long_documents_so_every_label_appears_once() -> None:
    stream = np.concatenate(_docs(5, 23, 1, 9))
    pieces = split_documents(stream, EOS, seq_len=8)
    assert [len(p) for p in pieces] == [5, 9, 9, 7, 9]  # 23 -> 9 + 9 + 7, overlap one
    labels = np.concatenate([p[1:] for p in pieces])
    assert len(labels) == 4 + 22 + 8 and (labels == EOS).sum() == 3  # the lone EOS has none


@pytest.mark.parametrize("preset", ["tiny", "tiny-gpt"])  # RoPE and learned positions
def test_packed_loss_equals_documents_run_separately(preset: str) -> None:
    spec = load_model(preset).with_(num_layers=2, vocab_size=258, seq_len=64)
    model = build_model(spec, seed=0)
    pieces = _docs(20, 31, 9)
    batch = build_batch(pieces, [[0, 1, 2]], seq_len=64, pad_id=PAD)
    logits = model(batch.input_ids, batch.position_ids, batch.attn_mask())
    packed = F.cross_entropy(logits[0], batch.labels[0], reduction="none")
    alone = []
    for doc in pieces:
        ids = torch.from_numpy(doc).long()[None]
        alone.append(F.cross_entropy(model(ids[:, :-1])[0], ids[0, 1:], reduction="none"))
    alone = torch.cat(alone)
    n = len(alone)
    torch.testing.assert_close(packed[:n], alone, rtol=1e-5, atol=1e-5)
    assert bool((packed[n:] == 0).all())  # padding carries no loss
    assert torch.isfinite(logits).all()  # padding rows attend to themselves, no NaN


def test_positions_and_mask_reset_per_document() -> None:
    batch = build_batch(_docs(3, 4), [[0, 1]], seq_len=6, pad_id=PAD)
    assert batch.position_ids.tolist() == [[0, 1, 0, 1, 2, 0]]
    assert batch.doc_ids.tolist() == [[0, 0, 1, 1, 1, -1]]
    mask = batch.attn_mask()[0, 0]
    assert mask[3].tolist() == [False, False, True, True, False, False]
    assert batch.num_tokens == 5 and batch.labels[0, 5] == IGNORE_INDEX


def test_best_fit_respects_capacity_and_fills_bins() -> None:
    rng = np.random.default_rng(0)
    slots = rng.integers(1, 100, 500).tolist()
    bins = pack_best_fit(slots, 128)
    assert sorted(i for b in bins for i in b) == list(range(500))
    assert all(sum(slots[i] for i in b) <= 128 for b in bins)
    assert len(bins) <= sum(slots) / 128 * 1.05 + 1
    with pytest.raises(DataError, match=r"1\.\.128"):
        pack_best_fit([129], 128)


def test_token_balancing_beats_contiguous_split() -> None:
    rng = np.random.default_rng(1)
    counts = rng.integers(1, 2048, 64).tolist()
    ranks = balance_by_tokens(counts, 8)
    assert all(len(r) == 8 for r in ranks)
    assert sorted(i for r in ranks for i in r) == list(range(64))
    loads = [sum(counts[i] for i in r) for r in ranks]
    contiguous = [sum(counts[r * 8 : (r + 1) * 8]) for r in range(8)]
    assert max(loads) - min(loads) < (max(contiguous) - min(contiguous)) / 4
    with pytest.raises(DataError, match="do not split"):
        balance_by_tokens(counts[:63], 8)


def test_dataset_on_builtin_corpus_pads_little_and_resumes(small_corpus, data_cache) -> None:
    tokens = prepare_tokens(small_corpus, ByteTokenizer(), cache_dir=data_cache)
    data = VarlenDataset(tokens, 1024, eos_id=EOS, pad_id=PAD, seed=0)
    padding = data.padding()
    assert padding["padded_to_longest"] > 0.3 and padding["packed"] < 0.02
    other = VarlenDataset(tokens, 1024, eos_id=EOS, pad_id=PAD, seed=0)  # rank 1's copy
    state = data.state_dict()
    a = [d.next_batch(8, rank=r, world=2) for r, d in enumerate((data, other))]
    data.load_state_dict(state)
    assert torch.equal(data.next_batch(8, rank=0, world=2).input_ids, a[0].input_ids)
    assert a[0].input_ids.shape == (4, 1024)
    both = torch.cat([a[0].input_ids, a[1].input_ids])
    assert len({tuple(r.tolist()) for r in both}) == 8  # the ranks split the batch
    with pytest.raises(DataError, match="another dataset"):
        data.load_state_dict({**state, "seq_len": 256})
