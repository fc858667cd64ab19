"""Variable-length packing: whole documents per sequence, attention kept inside each one.

``PackedDataset`` cuts the token stream into windows regardless of documents, so tokens
attend across document boundaries. Here (XTuner V1's variable-length mode) documents are
packed into sequences of ``seq_len`` slots by best-fit decreasing, each with positions
restarting at 0 and a block-diagonal causal mask, so a packed sequence computes exactly
what its documents would compute one by one, at the padding cost of packing (~0-1%)
instead of padding every document to the longest (~50% on the built-in corpus).

A document of n tokens (its end-of-text included) gives n - 1 (input, label) slots; one
longer than ``seq_len + 1`` tokens is cut into pieces of ``seq_len + 1`` that overlap by one
token, so every label is still predicted exactly once. Data-parallel ranks are balanced by
tokens, not sequences: :func:`balance_by_tokens` spreads each global batch so that every
rank gets the same number of sequences and as equal a number of real tokens as the
sorted greedy rule gives.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from legato.errors import DataError

IGNORE_INDEX = -100  # label of padding slots (torch's cross-entropy default)


@dataclass
class VarlenBatch:
    """Packed rows [B, S]: ``labels`` are IGNORE_INDEX and ``doc_ids`` -1 on padding."""

    input_ids: torch.Tensor
    labels: torch.Tensor
    position_ids: torch.Tensor
    doc_ids: torch.Tensor

    def attn_mask(self) -> torch.Tensor:
        """Boolean [B, 1, S, S], True = may attend: causal within a document (padding
        forms its own block, so no row is fully masked)."""
        same = self.doc_ids[:, :, None] == self.doc_ids[:, None, :]
        s = self.doc_ids.shape[1]
        causal = torch.ones(s, s, dtype=torch.bool, device=self.doc_ids.device).tril()
        return (same & causal)[:, None]

    @property
    def num_tokens(self) -> int:
        return int((self.labels != IGNORE_INDEX).sum())


def split_documents(tokens: np.ndarray, eos_id: int, seq_len: int) -> list[np.ndarray]:
    """The stream's documents (each ending with ``eos_id``; a tail without one is a
    document too), cut into pieces of at most ``seq_len + 1`` tokens overlapping by one."""
    ends = np.flatnonzero(np.asarray(tokens) == eos_id) + 1
    pieces = []
    for doc in np.split(np.asarray(tokens), ends):
        for start in range(0, max(len(doc) - 1, 0), seq_len):
            pieces.append(doc[start : start + seq_len + 1])
    return [p for p in pieces if len(p) >= 2]


def pack_best_fit(slots: Sequence[int], seq_len: int) -> list[list[int]]:
    """Bins of item indices with ``sum(slots) <= seq_len`` each, by best-fit decreasing:
    longest item first, into the open bin it fills most tightly."""
    if any(s > seq_len or s < 1 for s in slots):
        raise DataError(f"data.varlen: every item needs 1..{seq_len} slots")
    bins: list[list[int]] = []
    free: list[tuple[int, int]] = []  # (free slots, bin), sorted
    for item in sorted(range(len(slots)), key=lambda i: -slots[i]):
        at = bisect.bisect_left(free, (slots[item], -1))
        if at == len(free):
            bins.append([item])
            room, b = seq_len, len(bins) - 1
        else:
            room, b = free.pop(at)
            bins[b].append(item)
        if room - slots[item] > 0:
            bisect.insort(free, (room - slots[item], b))
    return bins


def padding_fraction(slots: Sequence[int], rows: int, row_len: int) -> float:
    """Share of ``rows x row_len`` slots that carry no label."""
    return 1.0 - sum(slots) / (rows * row_len) if rows else 0.0


def balance_by_tokens(counts: Sequence[int], world: int) -> list[list[int]]:
    """Assign sequences (``counts[i]`` real tokens each) to ``world`` ranks, the same number
    per rank, heaviest first to the least-loaded rank that has room."""
    if world < 1 or len(counts) % world:
        raise DataError(f"data: {len(counts)} sequences do not split over {world} ranks")
    share = len(counts) // world
    ranks: list[list[int]] = [[] for _ in range(world)]
    load = [0] * world
    for i in sorted(range(len(counts)), key=lambda i: -counts[i]):
        r = min((r for r in range(world) if len(ranks[r]) < share), key=lambda r: load[r])
        ranks[r].append(i)
        load[r] += counts[i]
    return ranks


def build_batch(
    pieces: Sequence[np.ndarray], rows: Sequence[Sequence[int]], seq_len: int, pad_id: int
) -> VarlenBatch:
    """Lay out ``rows`` (each a list of piece indices) as a :class:`VarlenBatch`."""
    shape = (len(rows), seq_len)
    inputs = np.full(shape, pad_id, dtype=np.int64)
    labels = np.full(shape, IGNORE_INDEX, dtype=np.int64)
    positions = np.zeros(shape, dtype=np.int64)
    docs = np.full(shape, -1, dtype=np.int64)
    for r, row in enumerate(rows):
        at = 0
        for d, i in enumerate(row):
            piece = pieces[i]
            n = len(piece) - 1
            inputs[r, at : at + n] = piece[:-1]
            labels[r, at : at + n] = piece[1:]
            positions[r, at : at + n] = np.arange(n)
            docs[r, at : at + n] = d
            at += n
    return VarlenBatch(*(torch.from_numpy(a) for a in (inputs, labels, positions, docs)))


class VarlenDataset:
    """Documents of a token stream packed once into sequences, served in a shuffled order
    per epoch with token-balanced data-parallel shares, and resumable like PackedDataset."""

    def __init__(
        self,
        tokens: np.ndarray,
        seq_len: int,
        *,
        eos_id: int,
        pad_id: int,
        seed: int,
        shuffle: bool = True,
    ) -> None:
        if not isinstance(seq_len, int) or seq_len < 1:
            raise DataError(f"train.seq_len: must be a positive integer, got {seq_len!r}")
        self.seq_len, self.pad_id, self.seed, self.shuffle = seq_len, pad_id, int(seed), shuffle
        self.num_tokens = len(tokens)
        self.pieces = split_documents(tokens, eos_id, seq_len)
        if not self.pieces:
            raise DataError("data: no document of at least two tokens to pack")
        self.slots = [len(p) - 1 for p in self.pieces]
        self.sequences = pack_best_fit(self.slots, seq_len)
        self.num_sequences = len(self.sequences)
        self.epoch = self.position = 0

    def padding(self) -> dict[str, float]:
        """Padding fraction when every document is padded to the longest, and packed."""
        longest = max(self.slots)
        return {
            "padded_to_longest": padding_fraction(self.slots, len(self.slots), longest),
            "packed": padding_fraction(self.slots, self.num_sequences, self.seq_len),
        }

    def _order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.num_sequences)
        return np.random.default_rng([self.seed, epoch]).permutation(self.num_sequences)

    def next_batch(self, global_batch: int, rank: int = 0, world: int = 1) -> VarlenBatch:
        """Consume ``global_batch`` packed sequences; return this rank's token-balanced
        share (``global_batch // world`` rows)."""
        if not 0 <= rank < world:
            raise DataError(f"data: rank {rank} is not in a world of size {world}")
        if global_batch < 1 or global_batch % world:
            raise DataError(
                f"train.global_batch: {global_batch} must be a positive multiple of the "
                f"{world} data-parallel ranks"
            )
        chosen: list[int] = []
        while len(chosen) < global_batch:
            order = self._order(self.epoch)
            take = order[self.position : self.position + global_batch - len(chosen)]
            chosen += take.tolist()
            self.position += len(take)
            if self.position == self.num_sequences:
                self.epoch, self.position = self.epoch + 1, 0
        counts = [sum(self.slots[i] for i in self.sequences[s]) for s in chosen]
        mine = balance_by_tokens(counts, world)[rank]
        rows = [self.sequences[chosen[j]] for j in sorted(mine)]
        return build_batch(self.pieces, rows, self.seq_len, self.pad_id)

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "position": self.position,
            "seed": self.seed,
            "seq_len": self.seq_len,
            "num_tokens": self.num_tokens,
            "num_sequences": self.num_sequences,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at ``state``'s position; a state of another packing is a DataError."""
        mine = self.state_dict()
        differ = [
            f"{k} {state.get(k)!r} (checkpoint) != {mine[k]!r} (now)"
            for k in ("seed", "seq_len", "num_tokens", "num_sequences")
            if state.get(k) != mine[k]
        ]
        if differ:
            raise DataError(f"data state is from another dataset: {'; '.join(differ)}")
        position = state.get("position")
        if not (isinstance(position, int) and 0 <= position < self.num_sequences):
            raise DataError(f"data state: position must be in 0..{self.num_sequences - 1}")
        self.epoch, self.position = int(state["epoch"]), position
