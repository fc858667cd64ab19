"""The summed token loss of one micro-batch: full logits, or the chunked LM head.

With ``loss_chunk > 0`` the LM head and cross-entropy run ``loss_chunk`` tokens at a time
(``legato.memory.chunked_lm_loss``), so the ``[tokens x vocab]`` logits never exist; the
sum is the same as the full computation's up to fp32 rounding.
"""

from __future__ import annotations

from torch import Tensor, nn

from legato.memory import chunked_lm_loss
from legato.parallel.pipeline.runner import IGNORE_INDEX, token_cross_entropy


def token_loss_sum(model: nn.Module, inputs: Tensor, labels: Tensor, loss_chunk: int) -> Tensor:
    """Cross-entropy summed over the label tokens of ``inputs`` (``IGNORE_INDEX`` skipped)."""
    if not loss_chunk:
        return token_cross_entropy(model(inputs), labels)
    return chunked_lm_loss(
        model,
        inputs,
        labels,
        chunk_size=loss_chunk,
        ignore_index=IGNORE_INDEX,
        reduction="sum",
    )
