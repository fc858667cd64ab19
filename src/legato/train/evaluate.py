"""Validation loss: the token-weighted mean cross-entropy over every window of a dataset.

Used by the trainer every ``train.eval_every`` steps and by ``legato eval``. The windows
are split into contiguous shares, one per data-parallel rank; each rank sums the loss and
counts the label tokens it holds, and the two sums are added over every rank before the
division, so the result is the mean over all tokens whatever the layout (not a mean of
per-rank means). What a rank holds is the step interface's ``eval_sums``: its cp shard of
each window, nothing off a pipeline's last stage, nothing on a tensor-parallel rank but
the first. Every rank runs the same number of forwards, since FSDP2, expert parallelism
and the pipeline are collective in the forward: a rank whose share ran out feeds a window
whose labels are all ignored.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch
from torch import Tensor, nn

from legato.data import PackedDataset
from legato.errors import DataError
from legato.parallel.loss import IGNORE_INDEX, eval_sums, token_loss_sum
from legato.train.run_data import eval_dataset, split_holdout, token_stream
from legato.train.trained_model import TrainedModel


class Evaluated(Protocol):
    """What ``evaluate`` runs: the trainer's step (``DataParallelStep``, ``PipelineStep``)
    or a ``WholeModel``."""

    module: nn.Module

    def eval_sums(self, inputs: Tensor, labels: Tensor) -> Tensor: ...


@dataclass
class WholeModel:
    """A whole model in one process (``legato eval``), under ``autocast``."""

    module: nn.Module
    autocast: Callable[[], contextlib.AbstractContextManager] = field(
        default=contextlib.nullcontext
    )
    loss_chunk: int = 0

    def eval_sums(self, inputs: Tensor, labels: Tensor) -> Tensor:
        with self.autocast():
            loss = token_loss_sum(self.module, inputs, labels, self.loss_chunk)
        return eval_sums(loss, labels, counted=True)


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
    model: Evaluated,
    dataset: PackedDataset,
    batch_size: int,
    *,
    device: torch.device,
    rank: int = 0,
    world: int = 1,
    all_reduce: Callable[[Tensor], Tensor] | None = None,
) -> EvalResult:
    """Collective over every rank when ``all_reduce`` sums over them; ``rank`` / ``world``
    are the data-parallel ones, which see different windows."""
    total = dataset.num_sequences
    share = -(-total // world)
    mine = np.arange(rank * share, min(total, (rank + 1) * share), dtype=np.int64)
    was_training = model.module.training
    model.module.eval()
    sums = torch.zeros(2, dtype=torch.float64, device=device)  # loss, label tokens
    try:
        for start in range(0, share, batch_size):
            windows = mine[start : start + batch_size]
            inputs, labels = dataset.windows(windows if len(windows) else np.zeros(1, np.int64))
            if not len(windows):  # a new tensor: the dataset's may be shared or cached
                labels = torch.full_like(labels, IGNORE_INDEX)
            sums += model.eval_sums(inputs.to(device), labels.to(device))
    finally:
        model.module.train(was_training)
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
