"""The summed token loss of one micro-batch: full logits, or the chunked LM head.

With ``loss_chunk > 0`` the LM head and cross-entropy run ``loss_chunk`` tokens at a time
(``legato.memory.chunked_lm_loss``), so the ``[tokens x vocab]`` logits never exist; the
sum is the same as the full computation's up to fp32 rounding.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh

from legato.memory import chunked_lm_loss
from legato.parallel.mesh import submesh
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


def eval_sums(loss: Tensor | None, labels: Tensor, counted: bool) -> Tensor:
    """[summed loss, label tokens] in float64, for an evaluation that sums them over every
    rank: zeros where this rank does not hold the loss (not the last pipeline stage) or
    is not ``counted`` (a tensor-parallel rank other than the first, whose tokens and
    loss the first already holds)."""
    if loss is None or not counted:
        return torch.zeros(2, dtype=torch.float64, device=labels.device)
    return torch.stack([loss.double(), (labels != IGNORE_INDEX).sum().double()])


def first_tensor_rank(mesh: DeviceMesh | None) -> bool:
    """Whether this rank is the first of its tensor-parallel group (the 1-D ``tp`` or the
    flattened 2-D one): the one that counts the tokens all of them hold."""
    return mesh is None or submesh(mesh, "tp").get_local_rank() == 0
