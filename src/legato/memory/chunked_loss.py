"""LM head + cross-entropy over token chunks: the [tokens x vocab] logits never exist at once.

With a 128K vocabulary and 64K tokens per device the logits alone are 32 GiB in fp32, more
than the whole model's share of memory under FSDP. This autograd function walks the tokens
in chunks of ``chunk_size``: for each chunk it computes the logits, the loss, and right
away the gradients for the hidden states and the head weight (softmax minus one-hot), then
drops the logits. Backward only scales the stored gradients by the incoming one. The head
GEMMs are the same three as unchunked (logits, d-hidden, d-weight), so no FLOPs are added;
the memory is ``chunk_size x vocab`` instead of ``tokens x vocab``.

Under tensor parallelism the head is vocabulary-parallel (a weight ``Shard(0)`` over the
tp ranks): each rank computes its ``chunk x V/tp`` logits, and the softmax's max and sum,
the target's logit and the hidden states' gradient are reduced over the tp group, as
Megatron's vocabulary-parallel cross-entropy does (torch's ``loss_parallel`` does the same
for whole logits, which the chunked loss never builds).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.tensor import DTensor, Replicate, Shard

from legato.errors import ConfigError


def _reduce(x: Tensor, group, op=dist.ReduceOp.SUM) -> Tensor:
    """``x`` reduced in place over the vocabulary-parallel ``group`` (None: one rank)."""
    if group is not None:
        dist.all_reduce(x, op=op, group=group)
    return x


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx,
        hidden: Tensor,
        weight: Tensor,
        labels: Tensor,
        chunk: int,
        ignore: int,
        mean: bool,
        group=None,
        vocab_start: int = 0,
    ):
        """``weight`` holds the vocabulary rows ``vocab_start`` onwards; ``group``: the
        ranks holding the others (None: all of them are here)."""
        valid = labels != ignore
        rows_here = weight.shape[0]
        count = (
            valid.sum().clamp(min=1).float() if mean else hidden.new_ones((), dtype=torch.float32)
        )
        needs_h, needs_w = ctx.needs_input_grad[:2]
        grad_h = torch.empty_like(hidden) if needs_h else None
        grad_w = weight.new_zeros(weight.shape, dtype=torch.float32) if needs_w else None
        total = hidden.new_zeros((), dtype=torch.float32)
        for start in range(0, hidden.shape[0], chunk):
            rows = slice(start, start + chunk)
            h, ok = hidden[rows], valid[rows]
            target = labels[rows].masked_fill(~ok, 0) - vocab_start
            here = ok & (target >= 0) & (target < rows_here)  # the target's row is here
            target = target.clamp(0, rows_here - 1)
            logits = (h @ weight.T).float()  # the one [chunk, V] buffer, reused below
            picked = _reduce(logits.gather(1, target[:, None]).squeeze(1) * here, group)
            top = _reduce(logits.amax(dim=-1, keepdim=True), group, dist.ReduceOp.MAX)
            sums = _reduce(logits.sub_(top).exp_().sum(dim=-1, keepdim=True), group)
            lse = (top + sums.log()).squeeze(1)
            total += ((lse - picked) * ok).sum()
            if not (needs_h or needs_w):
                continue
            grad = logits.div_(sums)  # softmax
            grad[torch.arange(len(target), device=grad.device), target] -= here.float()
            grad.mul_((ok / count)[:, None])
            grad = grad.to(hidden.dtype)
            if needs_h:
                grad_h[rows] = _reduce(grad @ weight, group)
            if needs_w:
                grad_w.addmm_(grad.T.float(), h.float())
        ctx.save_for_backward(grad_h, None if grad_w is None else grad_w.to(weight.dtype))
        return total / count

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        grad_h, grad_w = ctx.saved_tensors
        scale = grad_out.to(grad_h.dtype if grad_h is not None else grad_w.dtype)
        return (
            None if grad_h is None else grad_h * scale,
            None if grad_w is None else grad_w * scale,
            None,
            None,
            None,
            None,
            None,
            None,
        )


def chunked_cross_entropy(
    hidden: Tensor,
    weight: Tensor,
    labels: Tensor,
    *,
    chunk_size: int = 4096,
    ignore_index: int = -100,
    reduction: str = "mean",
) -> Tensor:
    """Cross-entropy of ``hidden @ weight.T`` against ``labels``, summed or averaged over
    the tokens whose label is not ``ignore_index`` (0 when there are none); ``hidden``
    [..., h], ``weight`` [V, h], ``labels`` [...]. Equals ``F.cross_entropy(F.linear(hidden,
    weight).float(), labels, reduction=reduction)`` in value and gradients (up to
    summation order)."""
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ConfigError(f"memory.loss_chunk: must be a positive integer, got {chunk_size!r}")
    if reduction not in ("mean", "sum"):
        raise ConfigError(f"chunked loss reduction: got {reduction!r}; allowed: mean, sum")
    group, start = None, 0
    if isinstance(weight, DTensor):
        hidden, weight, group, start = _vocabulary_parallel(hidden, weight)
    flat = hidden.reshape(-1, hidden.shape[-1])
    return _ChunkedLinearCrossEntropy.apply(
        flat, weight, labels.reshape(-1), chunk_size, ignore_index, reduction == "mean", group,
        start,
    )  # fmt: skip


def _vocabulary_parallel(hidden: Tensor, weight: DTensor) -> tuple[Tensor, Tensor, object, int]:
    """A tensor-parallel head's local rows, where they start, their group, and the hidden
    states whole on every rank (gathered from a sequence split)."""
    mesh = weight.device_mesh
    if mesh.ndim != 1 or tuple(weight.placements) != (Shard(0),):
        raise ConfigError(
            f"loss_chunk: the LM head must be split on the vocabulary over one tensor-"
            f"parallel dimension, got placements {tuple(weight.placements)} on a "
            f"{mesh.ndim}-D mesh"
        )
    if isinstance(hidden, DTensor):
        hidden = hidden.redistribute(hidden.device_mesh, [Replicate()]).to_local()
    rows = torch.arange(weight.shape[0]).chunk(mesh.size())  # DTensor's Shard(0) split
    start = sum(len(r) for r in rows[: mesh.get_local_rank()])
    return hidden, weight.to_local(), mesh.get_group(), start


def chunked_lm_loss(
    model,
    input_ids: Tensor,
    labels: Tensor,
    *,
    position_ids: Tensor | None = None,
    attn_mask: Tensor | None = None,
    chunk_size: int = 4096,
    ignore_index: int = -100,
    reduction: str = "mean",
) -> Tensor:
    """The reference model's LM loss through :func:`chunked_cross_entropy`, from
    ``model.hidden_states`` and ``model.output_weight()`` (so the logits are never built)."""
    hidden = model.hidden_states(input_ids, position_ids, attn_mask)
    return chunked_cross_entropy(
        hidden,
        model.output_weight(),
        labels,
        chunk_size=chunk_size,
        ignore_index=ignore_index,
        reduction=reduction,
    )
