"""Uneven local batches (Gimbal's input-sample stealing): rows and micro-batches per dp rank.

Within a fixed global batch, each data-parallel rank may train on its own number of rows
(``train.batch_split``, e.g. ``[5, 3]``), so a rank that shares its device with another job
gets fewer rows and does not make the others wait. Pure Python, no torch: the config, the
trainer and the step all ask the same functions.

Micro-batches: every rank runs the same count, ``max over ranks of ceil(rows_r / mbs)``,
because FSDP2 all-gathers parameters in every micro-batch's forward (and expert
parallelism exchanges tokens there): a rank that ran one micro-batch fewer would leave its
peers waiting in a collective forever. Each rank cuts its rows into that many nearly equal
chunks (sizes differ by at most one), so no chunk exceeds ``mbs`` rows, the memory bound
the micro-batch size exists for. A rank with fewer rows than that count would need an
empty chunk; such a split is refused (``check_batch_split``) rather than run with
micro-batches larger than ``mbs`` or with padding the slow rank would have to compute.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from legato.errors import ConfigError

FIELD = "train.batch_split"


def even_split(global_batch: int, dp: int) -> list[int]:
    """The default: ``global_batch / dp`` rows on every rank."""
    return [global_batch // dp] * dp


def microbatch_count(split: Sequence[int], mbs: int) -> int:
    """Micro-batches every rank runs in one step: ``max_r ceil(split[r] / mbs)``."""
    return max(math.ceil(rows / mbs) for rows in split)


def chunk_sizes(rows: int, count: int) -> list[int]:
    """``rows`` cut into ``count`` nearly equal chunks, the larger ones first."""
    base, extra = divmod(rows, count)
    return [base + (i < extra) for i in range(count)]


def check_batch_split(
    split: Sequence[int], global_batch: int, mbs: int, dp: int | None = None
) -> None:
    """A ConfigError naming ``train.batch_split`` and what is allowed, unless ``split`` has
    one entry >= 1 per dp rank (``dp``; None = not known yet), sums to the global batch and
    gives every rank at least as many rows as the step runs micro-batches."""
    if dp is not None and len(split) != dp:
        raise ConfigError(
            f"{FIELD}: must have one entry per data-parallel rank ({dp}), got {list(split)!r}"
        )
    if not split or min(split) < 1:
        raise ConfigError(f"{FIELD}: every entry must be >= 1, got {list(split)!r}")
    if sum(split) != global_batch:
        raise ConfigError(
            f"{FIELD}: must sum to train.global_batch_size ({global_batch}), got "
            f"{list(split)!r} (sum {sum(split)})"
        )
    count = microbatch_count(split, mbs)
    if min(split) < count:
        raise ConfigError(
            f"{FIELD}: every entry must be >= the micro-batches per step, max ceil(entry / "
            f"train.micro_batch_size) = {count} (every rank runs as many), got "
            f"{list(split)!r}; raise train.micro_batch_size to >= "
            f"{math.ceil(max(split) / min(split))} or the smallest entry to >= {count}"
        )
