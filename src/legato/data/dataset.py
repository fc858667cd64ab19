"""Pack a token stream into fixed-length training sequences and iterate them resumably.

The stream is cut into windows of ``seq_len + 1`` tokens starting every ``seq_len`` tokens,
so consecutive windows share one token: inputs are ``window[:-1]``, labels ``window[1:]``,
and every token of the stream is a label exactly once (except a tail shorter than
``seq_len``, which is dropped). Documents are not padded: end-of-text ids inside a window
separate them.

Each epoch visits every window once, in an order that is a permutation drawn from
``(seed, epoch)``. A global batch takes the next ``global_batch`` windows of that order and
each rank gets a contiguous share (equal, or as ``train.batch_split`` gives), so what the
whole job sees does not depend on the world size or the split, and the position (epoch,
index) is all the state needed to resume exactly.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from legato.errors import DataError

_STATE_KEYS = ("epoch", "position", "seed", "seq_len", "num_tokens", "shuffle", "fingerprint")
_FP_WINDOWS = 1024  # a stream longer than this many windows is fingerprinted by sampling
_FP_WINDOW = 4096


def stream_fingerprint(tokens: np.ndarray) -> str:
    """A digest of the token stream: exact for streams up to ~4M tokens, sampled beyond.

    Sampling 1024 evenly spaced windows of 4096 tokens keeps this instant for billions of
    tokens while still telling apart two different datasets of the same length.
    """
    digest = hashlib.blake2b(digest_size=8)
    digest.update(str(len(tokens)).encode())
    n = len(tokens)
    if n <= _FP_WINDOWS * _FP_WINDOW:
        starts = np.arange(0, max(n, 1), _FP_WINDOW)
    else:
        starts = np.linspace(0, n - _FP_WINDOW, _FP_WINDOWS).astype(np.int64)
    for start in starts:
        chunk = np.ascontiguousarray(tokens[start : start + _FP_WINDOW], dtype="<u4")
        digest.update(chunk.tobytes())
    return digest.hexdigest()


def split_tokens(tokens: np.ndarray, holdout: float) -> tuple[np.ndarray, np.ndarray]:
    """Split off the last ``holdout`` fraction of the stream (e.g. 0.01) for validation."""
    if not 0.0 < holdout < 1.0:
        raise DataError(f"data.holdout: must be between 0 and 1 (exclusive), got {holdout!r}")
    cut = len(tokens) - round(len(tokens) * holdout)
    return tokens[:cut], tokens[cut:]


class PackedDataset:
    """Shuffled fixed-length windows over a token stream, with exact resume."""

    def __init__(self, tokens: np.ndarray, seq_len: int, *, seed: int, shuffle: bool = True):
        if tokens.ndim != 1:
            raise DataError(f"data: token stream must be 1-D, got shape {tuple(tokens.shape)}")
        if not isinstance(seq_len, int) or seq_len < 1:
            raise DataError(f"data.seq_len: must be a positive integer, got {seq_len!r}")
        if len(tokens) < seq_len + 1:
            raise DataError(
                f"data: {len(tokens)} tokens are fewer than one sequence of seq_len + 1 = "
                f"{seq_len + 1} tokens; add data or lower seq_len"
            )
        self.tokens = tokens
        self.seq_len = seq_len
        self.seed = int(seed)
        self.shuffle = bool(shuffle)
        self.num_sequences = (len(tokens) - 1) // seq_len
        self.epoch = 0
        self.position = 0  # index into this epoch's order of the next window to serve
        self._order_epoch = -1
        self._order = np.empty(0, dtype=np.int64)
        self._fingerprint: str | None = None
        self._offsets = np.arange(seq_len + 1, dtype=np.int64)

    @property
    def fingerprint(self) -> str:
        if self._fingerprint is None:
            self._fingerprint = stream_fingerprint(self.tokens)
        return self._fingerprint

    def order(self, epoch: int) -> np.ndarray:
        """The window indices of ``epoch`` in the order they are served."""
        if epoch != self._order_epoch:
            if self.shuffle:
                rng = np.random.default_rng([self.seed, epoch])
                self._order = rng.permutation(self.num_sequences)
            else:
                self._order = np.arange(self.num_sequences)
            self._order_epoch = epoch
        return self._order

    def _take(self, count: int) -> np.ndarray:
        """Advance by ``count`` windows (rolling over epochs) and return their indices."""
        parts = []
        while count > 0:
            order = self.order(self.epoch)
            n = min(count, self.num_sequences - self.position)
            parts.append(order[self.position : self.position + n])
            self.position += n
            count -= n
            if self.position == self.num_sequences:
                self.epoch += 1
                self.position = 0
        return np.concatenate(parts)

    def next_batch(
        self, global_batch: int, rank: int = 0, world: int = 1, split: Sequence[int] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Consume ``global_batch`` windows; return this rank's rows as (inputs, labels).

        Both are int64 tensors of shape ``[rows, seq_len]``. ``split`` gives every rank's
        row count (uneven local batches, summing to ``global_batch``); None = the even
        ``global_batch // world``. Rank ``r`` gets rows ``sum(split[:r]) : sum(split[:r+1])``
        of the global batch. The position advances by the whole global batch whatever the
        split, so a resume with any split or world size serves every window exactly once.
        """
        if not isinstance(global_batch, int) or global_batch < 1:
            raise DataError(
                f"train.global_batch_size: must be a positive integer, got {global_batch!r}"
            )
        if world < 1 or not 0 <= rank < world:
            raise DataError(f"data: rank {rank} is not in a world of size {world}")
        if split is None:
            if global_batch % world:
                raise DataError(
                    f"train.global_batch_size: {global_batch} is not divisible by the {world} data-parallel ranks"
                )
            split = [global_batch // world] * world
        elif len(split) != world or sum(split) != global_batch or min(split) < 1:
            raise DataError(
                f"train.batch_split: must have {world} entries >= 1 summing to "
                f"{global_batch}, got {list(split)!r}"
            )
        start = sum(split[:rank])
        return self.windows(self._take(global_batch)[start : start + split[rank]])

    def windows(self, indices: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """The windows ``indices`` as (inputs, labels), int64 ``[len(indices), seq_len]``;
        reading them does not move the position. The two never share memory (slices of
        one window would for a single row, where ``contiguous()`` copies nothing), so a
        caller may change one in place."""
        rows = np.asarray(self.tokens[indices[:, None] * self.seq_len + self._offsets])
        inputs, labels = rows[:, :-1].astype(np.int64), rows[:, 1:].astype(np.int64)
        return torch.from_numpy(inputs), torch.from_numpy(labels)

    def state_dict(self) -> dict[str, Any]:
        """Plain JSON-able position plus what identifies the dataset it belongs to."""
        return {
            "epoch": self.epoch,
            "position": self.position,
            "seed": self.seed,
            "seq_len": self.seq_len,
            "num_tokens": len(self.tokens),
            "shuffle": self.shuffle,
            "fingerprint": self.fingerprint,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at ``state``'s position; a state of another dataset is a DataError."""
        missing = [k for k in _STATE_KEYS if k not in state]
        if missing:
            raise DataError(f"data state: missing {', '.join(missing)}")
        mine = self.state_dict()
        differ = [
            f"{k} {state[k]!r} (checkpoint) != {mine[k]!r} (now)"
            for k in ("num_tokens", "fingerprint", "seq_len", "seed", "shuffle")
            if state[k] != mine[k]
        ]
        if differ:
            raise DataError(f"data state is from another dataset: {'; '.join(differ)}")
        epoch, position = state["epoch"], state["position"]
        if not (isinstance(epoch, int) and epoch >= 0):
            raise DataError(f"data state: epoch must be a non-negative integer, got {epoch!r}")
        if not (isinstance(position, int) and 0 <= position < self.num_sequences):
            raise DataError(
                f"data state: position must be in 0..{self.num_sequences - 1}, got {position!r}"
            )
        self.epoch, self.position = epoch, position
