"""Validation loss: the token-weighted mean cross-entropy over every window of a dataset.

Used by the trainer every ``train.eval_every`` steps and by ``legato eval``. The windows
are split into contiguous shares, one per data-parallel rank; each rank sums the loss and
counts the label tokens of its share, and the two sums are added over ranks before the
division, so the result is the mean over all tokens whatever the world size (not a mean of
per-rank means). Every rank runs the same number of forwards, since FSDP2 and expert
parallelism are collective in the forward: a rank whose share ran out feeds a window whose
labels are all ignored.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from legato.data import PackedDataset
from legato.errors import DataError
from legato.parallel.loss import IGNORE_INDEX, token_loss_sum
from legato.train.run_data import eval_dataset, split_holdout, token_stream
from legato.train.trained_model import TrainedModel


@dataclass(frozen=True)
class EvalResult:
    """Mean loss in nats per label token over ``tokens`` tokens of ``sequences`` windows."""

    loss: float
    tokens: int
    sequences: int

    @property
    def perplexity(self) -> float:
        return math.exp(self.loss) if self.loss < 700 else math.inf

    def to_dict(self) -> dict[str, float | int]:
        return {
            "loss": self.loss,
            "perplexity": self.perplexity,
            "tokens": self.tokens,
            "sequences": self.sequences,
        }


@torch.no_grad()
def evaluate(
    model: nn.Module,
    dataset: PackedDataset,
    batch_size: int,
    *,
    device: torch.device,
    rank: int = 0,
    world: int = 1,
    all_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
    autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
    loss_chunk: int = 0,
) -> EvalResult:
    """Collective over the ``world`` ranks when ``all_reduce`` sums over them."""
    total = dataset.num_sequences
    share = -(-total // world)
    mine = np.arange(rank * share, min(total, (rank + 1) * share), dtype=np.int64)
    was_training = model.training
    model.eval()
    sums = torch.zeros(2, dtype=torch.float64, device=device)  # loss, label tokens
    try:
        for start in range(0, share, batch_size):
            windows = mine[start : start + batch_size]
            inputs, labels = dataset.windows(windows if len(windows) else np.zeros(1, np.int64))
            if not len(windows):  # a new tensor: the dataset's may be shared or cached
                labels = torch.full_like(labels, IGNORE_INDEX)
            inputs, labels = inputs.to(device), labels.to(device)
            with autocast():
                loss = token_loss_sum(model, inputs, labels, loss_chunk)
            sums[0] += loss.double()
            sums[1] += (labels != IGNORE_INDEX).sum()
    finally:
        model.train(was_training)
    if all_reduce is not None:
        all_reduce(sums)
    tokens = int(sums[1].item())
    return EvalResult(sums[0].item() / tokens, tokens, total)


def trained_eval_set(trained: TrainedModel, paths: list[str] | None = None) -> PackedDataset:
    """``paths`` tokenised with the run's tokenizer, or else the run's held-out split."""
    data = trained.config.data
    if paths:
        return eval_dataset(token_stream(data, trained.tokenizer, paths), trained.seq_len, "--data")
    _, held_out = split_holdout(token_stream(data, trained.tokenizer), data.holdout)
    if held_out is None:
        raise DataError(
            f"{trained.checkpoint}: the run has no held-out split (data.holdout = 0); "
            "pass --data PATH"
        )
    return eval_dataset(held_out, trained.seq_len, "data.holdout")
